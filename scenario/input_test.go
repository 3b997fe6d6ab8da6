package scenario

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"stockd.dev/stockd/node"
	"stockd.dev/stockd/node/nodetest"
)

// rawCall sends raw on a new connection to addr and reads one answer:
// its status and JSON body.
func rawCall(t *testing.T, addr, raw string) (int, map[string]any) {
	t.Helper()
	answers, _ := nodetest.RawExchange(t, addr, raw, 0, 1)
	var out map[string]any
	if err := json.Unmarshal([]byte(answers[0].Body), &out); err != nil {
		t.Fatalf("answer %d %q is not JSON", answers[0].Status, answers[0].Body)
	}
	return answers[0].Status, out
}

func rawPost(path, body string, headers ...string) string {
	var h strings.Builder
	for _, x := range headers {
		h.WriteString(x + "\r\n")
	}
	return fmt.Sprintf("POST %s HTTP/1.1\r\nHost: stockd\r\n%sContent-Length: %d\r\n\r\n%s", path, h.String(), len(body), body)
}

// TestInput_OneMeaningOrRefused sends input that could mean two things
// through both HTTP doors (the event loop and fasthttp) and, for the
// deduct's body, as a batch item: each is refused with 400 and a detail
// that names the field, and the ledger and the order feed are as they
// were. An e-mail address is a user id on every route.
func TestInput_OneMeaningOrRefused(t *testing.T) {
	cases := []struct {
		name, query, body, field string
		headers                  []string
	}{
		{"a user of invalid UTF-8", "", "{\"user\":\"\xff\"}", "user", nil},
		{"another user of invalid UTF-8", "", "{\"user\":\"\xfe\"}", "user", nil},
		{"a NUL inside a user", "", `{"user":"a\u0000b"}`, "user", nil},
		{"a control character in a user", "", `{"user":"a\u0007"}`, "user", nil},
		{"a lone surrogate", "", `{"user":"\ud800"}`, "user", nil},
		{"qty given twice", "", `{"user":"u1","qty":1,"qty":3}`, "qty", nil},
		{"user given twice", "", `{"user":"u1","user":"u2"}`, "user", nil},
		{"request_id given twice", "", `{"user":"u1","request_id":"a","request_id":"b"}`, "request_id", nil},
		{"a qty with a leading zero", "", `{"user":"u1","qty":01}`, "qty", nil},
		{"a fractional qty", "", `{"user":"u1","qty":1.0}`, "qty", nil},
		{"an empty request_id", "", `{"user":"u1","request_id":""}`, "request_id", nil},
		{"request_id in other letter case", "", `{"user":"u1","Request_id":"a"}`, "request_id", nil},
		{"an empty Idempotency-Key", "", `{"user":"u1"}`, "Idempotency-Key", []string{"Idempotency-Key:"}},
		{"two Idempotency-Keys", "", `{"user":"u1"}`, "Idempotency-Key", []string{"Idempotency-Key: a", "Idempotency-Key: b"}},
		{"wait given twice", "?wait=none&wait=commit", `{"user":"u1"}`, "wait", nil},
	}
	for _, loop := range []bool{true, false} {
		t.Run(fmt.Sprintf("event loop %v", loop), func(t *testing.T) {
			n := nodetest.StartNodeWith(t, t.TempDir(), func(c *node.Config) { c.DeductLoop = loop })
			cl := nodetest.ClientOf(n, 1)
			if code, out := nodetest.Call(t, cl, "PUT", "/v1/skus/tv", `{"total":10,"per_user":1}`); code != 201 {
				t.Fatalf("create sale: %d %v", code, out)
			}
			before := nodetest.CheckLedger(t, cl, "tv")
			_, feedBefore := nodetest.Call(t, cl, "GET", "/v1/events?limit=1000", "")
			for _, tc := range cases {
				code, out := rawCall(t, n.HTTPAddr(), rawPost("/v1/skus/tv/deduct"+tc.query, tc.body, tc.headers...))
				detail, _ := out["detail"].(string)
				if code != 400 || out["error"] != "bad_request" || !strings.HasPrefix(detail, tc.field+" ") && !strings.Contains(detail, " "+tc.field+" ") {
					t.Errorf("%s: %d %v, want 400 naming %s", tc.name, code, out, tc.field)
				}
				if tc.query != "" || tc.headers != nil {
					continue // the batch route has no per-item query or header
				}
				item := strings.Replace(tc.body, "{", `{"sku":"tv",`, 1)
				code, out = rawCall(t, n.HTTPAddr(), rawPost("/v1/deducts", `{"deducts":[`+item+`]}`))
				results, _ := out["results"].([]any)
				if code != 200 || len(results) != 1 {
					t.Errorf("%s as a batch item: %d %v", tc.name, code, out)
					continue
				}
				r := results[0].(map[string]any)
				detail, _ = r["detail"].(string)
				if r["status"] != 400.0 || !strings.HasPrefix(detail, tc.field+" ") {
					t.Errorf("%s as a batch item: %v, want 400 naming %s", tc.name, r, tc.field)
				}
			}
			after := nodetest.CheckLedger(t, cl, "tv")
			_, feedAfter := nodetest.Call(t, cl, "GET", "/v1/events?limit=1000", "")
			if fmt.Sprint(before) != fmt.Sprint(after) || fmt.Sprint(feedBefore["events"]) != fmt.Sprint(feedAfter["events"]) {
				t.Fatalf("refused input changed the ledger or the feed:\n  before %v %v\n  after  %v %v", before, feedBefore["events"], after, feedAfter["events"])
			}
			// An e-mail address buys, enters a lottery and reads back as sent.
			code, out := nodetest.Call(t, cl, "POST", "/v1/skus/tv/deduct", `{"user":"bob@x.com","request_id":"m1"}`)
			if code != 200 {
				t.Fatalf("a deduct by bob@x.com: %d %v", code, out)
			}
			if code, o := nodetest.Call(t, cl, "GET", "/v1/orders/"+out["order_id"].(string), ""); code != 200 || o["user"] != "bob@x.com" {
				t.Fatalf("bob@x.com's order reads %d %v", code, o)
			}
			close := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
			if code, out := nodetest.Call(t, cl, "PUT", "/v1/skus/raffle", `{"total":1,"mode":"lottery","entries_close_at":"`+close+`"}`); code != 201 {
				t.Fatalf("create lottery: %d %v", code, out)
			}
			if code, out := nodetest.Call(t, cl, "POST", "/v1/skus/raffle/enter", `{"user":"bob@x.com"}`); code != 202 || out["user"] != "bob@x.com" {
				t.Fatalf("bob@x.com's entry: %d %v", code, out)
			}
			if code, out := nodetest.Call(t, cl, "GET", "/v1/skus/raffle/entries/bob@x.com", ""); code != 200 || out["user"] != "bob@x.com" {
				t.Fatalf("bob@x.com's entry reads %d %v", code, out)
			}
			nodetest.CheckLedger(t, cl, "tv")
		})
	}
}

// TestInput_TimesAndQueriesOfOneMeaning: a time more precise than the
// ledger stores, and a single-valued query argument given twice, are
// refused naming the field.
func TestInput_TimesAndQueriesOfOneMeaning(t *testing.T) {
	n := nodetest.StartNode(t, t.TempDir())
	cl := nodetest.ClientOf(n, 1)
	f := func(method, path, body, field string) {
		t.Helper()
		code, out := nodetest.Call(t, cl, method, path, body)
		detail, _ := out["detail"].(string)
		if code != 400 || !strings.HasPrefix(detail, field+" ") {
			t.Errorf("%s %s %s: %d %v, want 400 naming %s", method, path, body, code, out, field)
		}
	}
	f("PUT", "/v1/skus/a", `{"total":1,"start_at":"2030-01-01T00:00:00.1234567891Z"}`, "start_at")
	f("PUT", "/v1/skus/b", `{"total":1,"mode":"lottery","entries_close_at":"2030-01-01T00:00:00.0000000001Z"}`, "entries_close_at")
	if code, out := nodetest.Call(t, cl, "PUT", "/v1/skus/c", `{"total":1,"start_at":"2030-01-01T00:00:00.123456789Z"}`); code != 201 || out["start_at"] != "2030-01-01T00:00:00.123456789Z" {
		t.Fatalf("nine fractional digits: %d %v, want 201 reading back as sent", code, out)
	}
	f("GET", "/v1/skus/c/orders?state=sold&state=held", "", "state")
	f("GET", "/v1/events?limit=5&limit=6", "", "limit")
	f("GET", "/v1/skus/c?consistency=linearizable&consistency=local", "", "consistency")
	for _, sku := range []string{"a", "b"} {
		if code, _ := nodetest.Call(t, cl, "GET", "/v1/skus/"+sku, ""); code != 404 {
			t.Fatalf("sale %s was made from a refused config: %d", sku, code)
		}
	}
}

// TestLottery_DrawnWithNoEntriesReadsClosed: a lottery that closes its
// entries with nobody in it reads closed, its units available, and a
// deduct is told closed, not lottery_sale.
func TestLottery_DrawnWithNoEntriesReadsClosed(t *testing.T) {
	n := nodetest.StartNode(t, t.TempDir())
	cl := nodetest.ClientOf(n, 1)
	closeAt := time.Now().Add(time.Second).UTC().Format(time.RFC3339Nano)
	if code, out := nodetest.Call(t, cl, "PUT", "/v1/skus/empty", `{"total":4,"mode":"lottery","entries_close_at":"`+closeAt+`"}`); code != 201 {
		t.Fatalf("create: %d %v", code, out)
	}
	var v map[string]any
	nodetest.WaitFor(t, 20*time.Second, "the empty lottery drawn", func() bool {
		_, v = nodetest.Call(t, cl, "GET", "/v1/skus/empty", "")
		return v["state"] == "closed"
	})
	if v["available"] != 4.0 || v["sold"] != 0.0 {
		t.Fatalf("the empty lottery after its draw: %v, want its 4 units available", v)
	}
	if code, out := nodetest.Call(t, cl, "POST", "/v1/skus/empty/deduct", `{"user":"late"}`); code != 409 || out["error"] != "closed" {
		t.Fatalf("a deduct on it: %d %v, want 409 closed", code, out)
	}
	nodetest.CheckLedger(t, cl, "empty")
}
