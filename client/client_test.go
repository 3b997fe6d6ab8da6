package client

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fakeNode is a stockd node of a test: it records the deduct bodies it
// got and answers each with the next of its scripted answers (the last
// one repeats).
type fakeNode struct {
	srv     *httptest.Server
	mu      sync.Mutex
	bodies  []map[string]any
	answers []func(w http.ResponseWriter)
	calls   atomic.Int64
}

func newFakeNode(t *testing.T, answers ...func(w http.ResponseWriter)) *fakeNode {
	t.Helper()
	n := &fakeNode{answers: answers}
	n.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/cluster" {
			w.WriteHeader(http.StatusOK)
			io.WriteString(w, `{"nodes":[]}`)
			return
		}
		var body map[string]any
		_ = json.NewDecoder(r.Body).Decode(&body)
		n.mu.Lock()
		n.bodies = append(n.bodies, body)
		i := min(int(n.calls.Add(1))-1, len(n.answers)-1)
		answer := n.answers[i]
		n.mu.Unlock()
		answer(w)
	}))
	t.Cleanup(n.srv.Close)
	return n
}

func (n *fakeNode) requestIDs() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []string
	for _, b := range n.bodies {
		out = append(out, fmt.Sprint(b["request_id"]))
	}
	return out
}

func status(code int, body string) func(w http.ResponseWriter) {
	return func(w http.ResponseWriter) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		io.WriteString(w, body)
	}
}

var (
	won         = status(200, `{"order_id":"n1-1-x","state":"sold","sku":"phone","qty":1}`)
	unavailable = status(503, `{"error":"unavailable","detail":"no leader"}`)
	unknown     = status(504, `{"error":"outcome_unknown","detail":"retry"}`)
	soldOut     = status(409, `{"error":"sold_out","detail":"no units left"}`)
	reused      = status(422, `{"error":"request_id_reused","detail":"another sku"}`)
	// dropped closes the connection without an answer.
	dropped = func(w http.ResponseWriter) {
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			conn.Close()
		}
	}
	limited = func(w http.ResponseWriter) {
		w.Header().Set("Retry-After", "1")
		status(429, `{"error":"rate_limited","detail":"later"}`)(w)
	}
)

func newTestClient(t *testing.T, nodes ...*fakeNode) *Client {
	t.Helper()
	var endpoints []string
	for _, n := range nodes {
		endpoints = append(endpoints, n.srv.URL)
	}
	c, err := New(Config{Endpoints: endpoints, AttemptTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestDeduct_NotDefiniteAnswersAreRetriedWithTheSameRequestID: 503, 504
// and a dropped connection on one node are retried on the other, with the
// request id the first attempt carried (made by the client when the
// caller gave none).
func TestDeduct_NotDefiniteAnswersAreRetriedWithTheSameRequestID(t *testing.T) {
	for name, failure := range map[string]func(http.ResponseWriter){"503": unavailable, "504": unknown, "dropped": dropped} {
		t.Run(name, func(t *testing.T) {
			bad, good := newFakeNode(t, failure), newFakeNode(t, won)
			c := newTestClient(t, bad, good)
			var ids []string
			for i := 0; i < 4; i++ { // the round robin starts on each node in turn
				o, err := c.Deduct(context.Background(), Deduct{SKU: "phone", User: "alice"})
				if err != nil || o.OrderID != "n1-1-x" || o.State != "sold" || o.RequestID == "" {
					t.Fatalf("deduct: %+v %v", o, err)
				}
				ids = append(ids, o.RequestID)
			}
			if bad.calls.Load() == 0 {
				t.Fatal("the failing node was never tried")
			}
			seen := map[string]bool{}
			for _, id := range good.requestIDs() {
				seen[id] = true
			}
			for _, id := range bad.requestIDs() {
				if !seen[id] {
					t.Fatalf("request id %s failed on one node and was not retried with it on the other (%v)", id, good.requestIDs())
				}
			}
			if len(seen) != len(ids) {
				t.Fatalf("%d calls made %d request ids", len(ids), len(seen))
			}
		})
	}
}

// TestDeduct_DefiniteAnswersAreNeverRetried: a refusal is the answer,
// with its sentinel and the request id.
func TestDeduct_DefiniteAnswersAreNeverRetried(t *testing.T) {
	f := func(answer func(http.ResponseWriter), want error) {
		t.Helper()
		n := newFakeNode(t, answer)
		c := newTestClient(t, n)
		o, err := c.Deduct(context.Background(), Deduct{SKU: "phone", User: "alice", RequestID: "r-1"})
		var e *Error
		if !errors.Is(err, want) || !errors.As(err, &e) || e.RequestID != "r-1" || o.RequestID != "r-1" {
			t.Fatalf("deduct: %+v %v, want %v", o, err, want)
		}
		if n.calls.Load() != 1 {
			t.Fatalf("a definite answer was sent %d times", n.calls.Load())
		}
	}
	f(soldOut, ErrSoldOut)
	f(reused, ErrRequestIDReused)
	f(status(409, `{"error":"user_limit"}`), ErrUserLimit)
	f(status(425, `{"error":"not_started"}`), ErrNotStarted)
	f(status(404, `{"error":"unknown_sku"}`), ErrUnknownSKU)
	f(status(400, `{"error":"bad_request"}`), ErrBadRequest)
}

// TestDeduct_RateLimitedWaitsForRetryAfter: a 429 is tried again after
// its Retry-After, not before.
func TestDeduct_RateLimitedWaitsForRetryAfter(t *testing.T) {
	n := newFakeNode(t, limited, won)
	c := newTestClient(t, n)
	start := time.Now()
	o, err := c.Deduct(context.Background(), Deduct{SKU: "phone", User: "alice", RequestID: "r-1"})
	if err != nil || o.OrderID == "" {
		t.Fatalf("deduct: %+v %v", o, err)
	}
	if took := time.Since(start); took < time.Second {
		t.Fatalf("retried %s after a 429 with Retry-After: 1", took)
	}
	if ids := n.requestIDs(); len(ids) != 2 || ids[0] != "r-1" || ids[1] != "r-1" {
		t.Fatalf("request ids sent: %v", ids)
	}
}

// TestDeduct_ContextEndsTheRetries: a cluster that never answers
// definitely ends the call at the context's deadline, with an error that
// names the request id and matches both ErrNotDefinite and the context's
// error.
func TestDeduct_ContextEndsTheRetries(t *testing.T) {
	a, b := newFakeNode(t, unavailable), newFakeNode(t, unknown)
	c := newTestClient(t, a, b)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	o, err := c.Deduct(ctx, Deduct{SKU: "phone", User: "alice"})
	var nd *NotDefiniteError
	if !errors.Is(err, ErrNotDefinite) || !errors.Is(err, context.DeadlineExceeded) || !errors.As(err, &nd) || nd.RequestID != o.RequestID || o.RequestID == "" {
		t.Fatalf("deduct past the deadline: %+v %v", o, err)
	}
	if !strings.Contains(err.Error(), o.RequestID) {
		t.Fatalf("the error does not name the request id: %v", err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("the call outlived its 300ms context by far: %s", took)
	}
	if a.calls.Load()+b.calls.Load() < 2 {
		t.Fatalf("only %d attempts before the deadline", a.calls.Load()+b.calls.Load())
	}
}

// TestNew_RefusesBadEndpoints: a config that cannot work says why.
func TestNew_RefusesBadEndpoints(t *testing.T) {
	for _, endpoints := range [][]string{nil, {"10.0.0.1:8080"}, {"ftp://x"}, {"http://a:1", "https://b:2"}} {
		if _, err := New(Config{Endpoints: endpoints}); err == nil {
			t.Fatalf("endpoints %q accepted", endpoints)
		}
	}
}

// TestDeductBatch_RetriesOnlyTheItemsNotAnswered: an item answered 503
// inside the batch is sent again, alone, with its request id; a batch
// dropped whole is sent again whole.
func TestDeductBatch_RetriesOnlyTheItemsNotAnswered(t *testing.T) {
	n := newFakeNode(t,
		dropped,
		status(200, `{"results":[{"status":200,"order_id":"o1","state":"sold","sku":"a","qty":1},{"status":503,"error":"unavailable"},{"status":409,"error":"sold_out"}]}`),
		status(200, `{"results":[{"status":200,"order_id":"o2","state":"sold","sku":"a","qty":1}]}`))
	c := newTestClient(t, n)
	res := c.DeductBatch(context.Background(), []Deduct{{SKU: "a", User: "u1"}, {SKU: "a", User: "u2", RequestID: "r-2"}, {SKU: "a", User: "u3"}})
	if res[0].Err != nil || res[0].Order.OrderID != "o1" || res[1].Err != nil || res[1].Order.OrderID != "o2" || !errors.Is(res[2].Err, ErrSoldOut) {
		t.Fatalf("results: %+v", res)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if len(n.bodies) != 3 {
		t.Fatalf("%d batch requests, want 3 (dropped, answered, the one item again)", len(n.bodies))
	}
	last := n.bodies[2]["deducts"].([]any)
	if len(last) != 1 || last[0].(map[string]any)["request_id"] != "r-2" {
		t.Fatalf("the retry sent %v, want r-2 alone", last)
	}
	first, second := n.bodies[0]["deducts"].([]any), n.bodies[1]["deducts"].([]any)
	if fmt.Sprint(first) != fmt.Sprint(second) {
		t.Fatalf("the dropped batch was sent again as %v, first %v", second, first)
	}
}

// TestShardScore_IsTheDocumentedFunction: the first 8 bytes of SHA-256
// over name, 0x00, sku; the figures were computed apart from Go (a few
// lines of Python), as a client in another language would.
func TestShardScore_IsTheDocumentedFunction(t *testing.T) {
	f := func(name, sku string, want uint64) {
		t.Helper()
		if got := ShardScore(name, sku); got != want {
			t.Fatalf("ShardScore(%q, %q) = %d, want %d", name, sku, got, want)
		}
	}
	f("east", "phone", 7350999218743607683)
	f("west", "phone", 12911646351512336729)
	f("east", "sku1", 16621545248659859598)
	f("west", "sku1", 9024672705044556703)
	s := &Sharded{names: []string{"east", "west"}}
	if s.ClusterOf("phone") != "west" || s.ClusterOf("sku1") != "east" {
		t.Fatalf("phone on %s, sku1 on %s; want west and east", s.ClusterOf("phone"), s.ClusterOf("sku1"))
	}
}

// TestRestock_IsNotSentTwiceWhenItMayHaveBeenApplied: a restock answered
// 504 ends at once with ErrMaybeApplied (not sent again); one answered
// 503 is sent again.
func TestRestock_IsNotSentTwiceWhenItMayHaveBeenApplied(t *testing.T) {
	n := newFakeNode(t, unknown, status(200, `{"sku":"a","total":5}`))
	c := newTestClient(t, n)
	_, err := c.Restock(context.Background(), "a", 5)
	if !errors.Is(err, ErrMaybeApplied) || !errors.Is(err, ErrNotDefinite) || n.calls.Load() != 1 {
		t.Fatalf("restock answered 504: %v after %d sends", err, n.calls.Load())
	}
	m := newFakeNode(t, unavailable, status(200, `{"sku":"a","total":5}`))
	c = newTestClient(t, m)
	if s, err := c.Restock(context.Background(), "a", 5); err != nil || s.Total != 5 || m.calls.Load() != 2 {
		t.Fatalf("restock answered 503 then 200: %+v %v after %d sends", s, err, m.calls.Load())
	}
}

// TestClient_TokensAndTLS: the service token goes with deducts, the
// admin token with admin calls, as bearer tokens; Config.TLS reaches an
// HTTPS node.
func TestClient_TokensAndTLS(t *testing.T) {
	var got sync.Map // path -> Authorization
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got.Store(r.URL.Path, r.Header.Get("Authorization"))
		switch r.URL.Path {
		case "/v1/cluster":
			io.WriteString(w, `{"nodes":[]}`)
		case "/v1/skus/a":
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, `{"sku":"a","total":1}`)
		default:
			won(w)
		}
	}))
	defer srv.Close()
	c, err := New(Config{Endpoints: []string{srv.URL}, ServiceToken: "svc", AdminToken: "adm",
		TLS: srv.Client().Transport.(*http.Transport).TLSClientConfig})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Deduct(context.Background(), Deduct{SKU: "a", User: "u"}); err != nil {
		t.Fatalf("deduct over TLS: %v", err)
	}
	if _, err := c.CreateSale(context.Background(), "a", SaleConfig{Total: 1}); err != nil {
		t.Fatalf("create over TLS: %v", err)
	}
	for path, want := range map[string]string{"/v1/skus/a/deduct": "Bearer svc", "/v1/skus/a": "Bearer adm"} {
		if v, _ := got.Load(path); v != want {
			t.Fatalf("%s carried Authorization %q, want %q", path, v, want)
		}
	}
}

// TestTLSFiles_RefusesWhatCannotBeUsed: a missing CA file, a file with no
// certificate in it, and a certificate without its key are errors that
// name what is wrong, not a config that fails at the first handshake.
func TestTLSFiles_RefusesWhatCannotBeUsed(t *testing.T) {
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(notPEM, []byte("not a certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		ca, cert, key, want string
	}{
		{filepath.Join(dir, "missing.pem"), "", "", "no such file"},
		{notPEM, "", "", "no PEM certificate"},
		{"", filepath.Join(dir, "svc.pem"), "", "needs both its file and its key"},
		{"", filepath.Join(dir, "svc.pem"), filepath.Join(dir, "svc-key.pem"), "load client certificate"},
	} {
		if _, err := TLSFiles(c.ca, c.cert, c.key); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("TLSFiles(%q, %q, %q): want an error with %q, got %v", c.ca, c.cert, c.key, c.want, err)
		}
	}
	cfg, err := TLSFiles("", "", "")
	if err != nil || cfg.RootCAs != nil || cfg.MinVersion != tls.VersionTLS12 {
		t.Errorf("TLSFiles with no files: %+v, %v; want the system's roots and TLS 1.2 at least", cfg, err)
	}
}
