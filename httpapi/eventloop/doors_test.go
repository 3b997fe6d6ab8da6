package eventloop_test

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"reflect"
	"strings"
	"testing"
	"time"

	"stockd.dev/stockd/engine"
	"stockd.dev/stockd/httpapi"
	"stockd.dev/stockd/httpapi/eventloop"
	"stockd.dev/stockd/node/nodetest"
	"stockd.dev/stockd/stock"
)

// echoEngine answers a deduct from what it was asked, so an answer shows
// how the door read the request: the order id spells the user, request
// id, qty and wait mode it got. SKU "none" is sold out, "gone" unknown,
// "busy" rate limited; on "later" the loop's deduct is answered from
// another goroutine, as a commit is. Every other method of the engine is
// left nil: the doors must not need it for a deduct.
type echoEngine struct {
	httpapi.Engine
}

func (e *echoEngine) Deduct(req *engine.DeductRequest, res *engine.DeductResult) {
	*res = engine.DeductResult{}
	switch string(req.SKU) {
	case "none":
		res.Status = engine.StatusSoldOut
	case "gone":
		res.Status = engine.StatusUnknownSKU
	case "busy":
		res.Status, res.RetryAfter = engine.StatusRateLimited, 1500*time.Millisecond
	default:
		res.Status = engine.StatusOK
		state := stock.OrderSold
		if req.NoWait {
			res.Status, state = engine.StatusAccepted, stock.OrderState("pending")
		}
		res.Order = stock.Order{ID: fmt.Sprintf("%s|%s|%d", req.User, req.RequestID, req.Qty), SKU: string(req.SKU), Qty: req.Qty, State: state}
	}
}

func (e *echoEngine) DeductAsync(req *engine.DeductRequest, res *engine.DeductResult, done func(*engine.DeductResult)) bool {
	if string(req.SKU) != "later" {
		e.Deduct(req, res)
		return true
	}
	// The request's bytes are the loop's until DeductAsync returns.
	own := engine.DeductRequest{SKU: []byte(string(req.SKU)), User: []byte(string(req.User)),
		RequestID: []byte(string(req.RequestID)), Qty: req.Qty, NoWait: req.NoWait}
	go func() {
		var out engine.DeductResult
		e.Deduct(&own, &out)
		done(&out)
	}()
	return false
}

// doors serves one echoEngine's deducts through both HTTP doors: the
// fasthttp handlers alone, and the event loop in front of them.
type doors struct {
	handlers, loop string // addresses
	front          *eventloop.Loop
}

func startDoors(t *testing.T) doors {
	t.Helper()
	if !eventloop.Available {
		t.Skip("the event loop needs Linux's epoll")
	}
	cfg := httpapi.DefaultConfig()
	cfg.ServiceToken, cfg.AdminToken = "svc", "adm"
	var d doors
	serve := func(eng *echoEngine, withLoop bool) string {
		srv, err := httpapi.New(cfg, eng, nil, "test")
		if err != nil {
			t.Fatal(err)
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		served := ln
		if withLoop {
			front, handed, err := eventloop.Serve(ln.(*net.TCPListener), eventloop.Config{
				Engine: eng, Credentials: srv.Credentials(), MaxConns: cfg.MaxConns,
				ReadTimeout: cfg.ReadTimeout, WriteTimeout: cfg.WriteTimeout, IdleTimeout: cfg.IdleTimeout,
				Observe: srv.ObserveDeduct,
			})
			if err != nil {
				t.Fatal(err)
			}
			srv.SetFrontDoor(front)
			d.front = front
			served = handed
		}
		srv.Serve(served)
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := srv.Shutdown(ctx); err != nil {
				t.Errorf("shutdown: %v", err)
			}
		})
		return served.Addr().String()
	}
	d.handlers = serve(&echoEngine{}, false)
	d.loop = serve(&echoEngine{}, true)
	return d
}

// post is a deduct's request: path after /v1/skus/, headers, body.
func post(path, body string, headers ...string) string {
	var h strings.Builder
	for _, x := range headers {
		h.WriteString(x + "\r\n")
	}
	return fmt.Sprintf("POST /v1/skus/%s HTTP/1.1\r\nHost: stockd\r\n%sContent-Length: %d\r\n\r\n%s", path, h.String(), len(body), body)
}

const auth = "Authorization: Bearer svc"

// TestDoors_AnswerTheSameRequestsAlike sends each request of the table
// through both doors, the fasthttp handlers and the event loop in front
// of them, and requires the same answers: status, headers and body, and
// whether the connection stays open. The loop must also have served the
// plain deducts itself, not handed them all over.
func TestDoors_AnswerTheSameRequestsAlike(t *testing.T) {
	d := startDoors(t)
	u := func(user string) string { return `{"user":"` + user + `"}` }
	cases := []struct {
		name    string
		raw     string
		answers int // answers to read (pipelined requests)
		split   int
	}{
		{"a win", post("tv/deduct", `{"user":"u1","qty":1,"request_id":"r1"}`, auth), 1, 0},
		{"three units", post("tv/deduct", `{"user":"u1","qty":3,"request_id":"r2"}`, auth), 1, 0},
		{"no qty means one", post("tv/deduct", u("u2"), auth), 1, 0},
		{"wait=commit", post("tv/deduct?wait=commit", u("u3"), auth), 1, 0},
		{"wait=none", post("tv/deduct?wait=none", u("u4"), auth), 1, 0},
		{"wait empty", post("tv/deduct?wait=", u("u5"), auth), 1, 0},
		{"a bad wait", post("tv/deduct?wait=later", u("u6"), auth), 1, 0},
		{"wait given twice", post("tv/deduct?wait=none&wait=commit", u("u7"), auth), 1, 0},
		{"a percent-encoded wait", post("tv/deduct?wait=%6eone", u("u8"), auth), 1, 0},
		{"another query argument", post("tv/deduct?x=1&wait=none", u("u9"), auth), 1, 0},
		{"sold out", post("none/deduct", u("u10"), auth), 1, 0},
		{"an unknown sale", post("gone/deduct", u("u11"), auth), 1, 0},
		{"rate limited, with Retry-After", post("busy/deduct", u("u12"), auth), 1, 0},
		{"answered from another goroutine", post("later/deduct", `{"user":"u13","request_id":"l1"}`, auth), 1, 0},
		{"no credential", post("tv/deduct", u("u14")), 1, 0},
		{"a wrong token", post("tv/deduct", u("u15"), "Authorization: Bearer nope"), 1, 0},
		{"the admin token", post("tv/deduct", u("u16"), "Authorization: Bearer adm"), 1, 0},
		{"a lower-case scheme", post("tv/deduct", u("u17"), "Authorization: bearer svc"), 1, 0},
		{"a body that is not JSON", post("tv/deduct", `{"user":`, auth), 1, 0},
		{"an empty body", post("tv/deduct", ``, auth), 1, 0},
		{"an array", post("tv/deduct", `[]`, auth), 1, 0},
		{"no user", post("tv/deduct", `{"qty":1}`, auth), 1, 0},
		{"an empty user", post("tv/deduct", `{"user":""}`, auth), 1, 0},
		{"a user over 128 bytes", post("tv/deduct", u(strings.Repeat("x", 129)), auth), 1, 0},
		{"qty 0", post("tv/deduct", `{"user":"u18","qty":0}`, auth), 1, 0},
		{"qty over the most", post("tv/deduct", `{"user":"u19","qty":1001}`, auth), 1, 0},
		{"a fractional qty", post("tv/deduct", `{"user":"u20","qty":1.5}`, auth), 1, 0},
		{"qty as a string", post("tv/deduct", `{"user":"u21","qty":"1"}`, auth), 1, 0},
		{"qty with a leading zero", post("tv/deduct", `{"user":"u22","qty":01}`, auth), 1, 0},
		{"a repeated key", post("tv/deduct", `{"user":"u23","user":"u24"}`, auth), 1, 0},
		{"an escaped user", post("tv/deduct", `{"user":"\u0075\u0032\u0035"}`, auth), 1, 0},
		{"another key", post("tv/deduct", `{"user":"u26","sku":"tv"}`, auth), 1, 0},
		{"a field in other letter case", post("tv/deduct", `{"user":"u26","QTY":2}`, auth), 1, 0},
		{"a control character in the request id", post("tv/deduct", `{"user":"u27","request_id":"a\u0001"}`, auth), 1, 0},
		{"bytes after the object", post("tv/deduct", `{"user":"u28"} x`, auth), 1, 0},
		{"Idempotency-Key alone", post("tv/deduct", u("u29"), auth, "Idempotency-Key: k1"), 1, 0},
		{"Idempotency-Key equal to the body's", post("tv/deduct", `{"user":"u30","request_id":"k2"}`, auth, "Idempotency-Key: k2"), 1, 0},
		{"Idempotency-Key unlike the body's", post("tv/deduct", `{"user":"u31","request_id":"k3"}`, auth, "Idempotency-Key: k4"), 1, 0},
		{"Idempotency-Key in lower case", post("tv/deduct", u("u32"), auth, "idempotency-key: k5"), 1, 0},
		{"Idempotency-Key empty", post("tv/deduct", u("u33"), auth, "Idempotency-Key:"), 1, 0},
		{"two Idempotency-Keys", post("tv/deduct", u("u34"), auth, "Idempotency-Key: k6", "Idempotency-Key: k7"), 1, 0},
		{"Idempotency-Key over 128 bytes", post("tv/deduct", u("u35"), auth, "Idempotency-Key: "+strings.Repeat("k", 129)), 1, 0},
		{"a bad sku", post("bad%20sku/deduct", u("u36"), auth), 1, 0},
		{"a sku over 128 bytes", post(strings.Repeat("s", 129)+"/deduct", u("u37"), auth), 1, 0},
		{"dot segments", post("x/../tv/deduct", u("u38"), auth), 1, 0},
		{"the lottery's route ending in /deduct", post("tv/entries/u39/deduct", u("u39"), auth), 1, 0},
		{"a GET of the route", "GET /v1/skus/tv/deduct HTTP/1.1\r\nHost: stockd\r\n" + auth + "\r\n\r\n", 1, 0},
		{"a PUT of the route", "PUT /v1/skus/tv/deduct HTTP/1.1\r\nHost: stockd\r\n" + auth + "\r\nContent-Length: 2\r\n\r\n{}", 1, 0},
		{"chunked", "POST /v1/skus/tv/deduct HTTP/1.1\r\nHost: stockd\r\n" + auth + "\r\nTransfer-Encoding: chunked\r\n\r\nd\r\n{\"user\":\"u40\"\r\n1\r\n}\r\n0\r\n\r\n", 1, 0},
		{"Expect: 100-continue", post("tv/deduct", u("u41"), auth, "Expect: 100-continue"), 1, 0},
		{"a body over 16 KiB", post("tv/deduct", `{"user":"u42","pad":"`+strings.Repeat("p", 17<<10)+`"}`, auth), 1, 0},
		{"a head over 8 KiB", post("tv/deduct", u("u43"), auth, "X-Pad: "+strings.Repeat("p", 9000)), 1, 0},
		{"a malformed request line", "POST\r\n\r\n", 1, 0},
		{"Connection: close", post("tv/deduct", u("u44"), auth, "Connection: close"), 1, 0},
		{"HTTP/1.0", "POST /v1/skus/tv/deduct HTTP/1.0\r\n" + auth + "\r\nContent-Length: 14\r\n\r\n{\"user\":\"u45\"}", 1, 0},
		{"written 7 bytes at a time", post("tv/deduct", `{"user":"u46","request_id":"s1"}`, auth), 1, 7},
		{"two deducts pipelined", post("tv/deduct", u("u47"), auth) + post("none/deduct", u("u48"), auth), 2, 0},
		{"a deduct answered later, then one at once, pipelined", post("later/deduct", u("u49"), auth) + post("tv/deduct?wait=none", u("u50"), auth), 2, 0},
		{"a deduct and a health check pipelined", post("tv/deduct", u("u51"), auth) + "GET /healthz HTTP/1.1\r\nHost: stockd\r\n\r\n", 2, 0},
		{"a bad deduct, then a good one, pipelined", post("tv/deduct", `{"user":0}`, auth) + post("tv/deduct", u("u52"), auth), 2, 0},
		{"a deduct without a token, then one with, pipelined", post("tv/deduct", u("u53")) + post("tv/deduct", u("u54"), auth), 2, 0},
	}
	if len(cases) < 40 {
		t.Fatalf("the table has %d requests; it is meant to cover at least 40", len(cases))
	}
	t.Run("requests", func(t *testing.T) {
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				viaHandlers, closedHandlers := nodetest.RawExchange(t, d.handlers, tc.raw, tc.split, tc.answers)
				viaLoop, closedLoop := nodetest.RawExchange(t, d.loop, tc.raw, tc.split, tc.answers)
				if !reflect.DeepEqual(viaHandlers, viaLoop) || closedHandlers != closedLoop {
					t.Errorf("handlers: %+v (closed: %v)\nloop:     %+v (closed: %v)", viaHandlers, closedHandlers, viaLoop, closedLoop)
				}
			})
		}
	})
	// The loop served the plain deducts itself (about half of the table);
	// the handlers answered what it handed over.
	var m bytes.Buffer
	d.front.WriteMetrics(&m)
	var served int
	for _, line := range strings.Split(m.String(), "\n") {
		fmt.Sscanf(line, "stockd_http_event_loop_deducts_total %d", &served)
	}
	if served < 20 {
		t.Errorf("the loop served %d deducts itself; it should serve the table's plain ones:\n%s", served, m.String())
	}
}
