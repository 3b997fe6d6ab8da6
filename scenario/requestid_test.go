package scenario

import (
	"fmt"
	"stockd.dev/stockd/node/nodetest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// callWithHeader is call with one extra request header.
func callWithHeader(t *testing.T, c *fasthttp.HostClient, method, path, body, header, value string) (int, map[string]any) {
	t.Helper()
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(nodetest.URL(c, path))
	req.Header.SetMethod(method)
	req.Header.Set(header, value)
	req.SetBodyString(body)
	if err := c.Do(req, resp); err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	contractLog.record(req, resp)
	var out map[string]any
	if err := jsonUnmarshal(resp.Body(), &out); err != nil {
		t.Fatalf("%s %s: answer %q is not JSON: %v", method, path, resp.Body(), err)
	}
	return resp.StatusCode(), out
}

// soldOf is a sale's sold units as its audit counts them, after checking
// the conservation law and the order recount.
func soldOf(t *testing.T, c *fasthttp.HostClient, sku string) float64 {
	t.Helper()
	return nodetest.CheckLedger(t, c, sku)["sold"].(float64)
}

// TestRequestID_ScopedToTheUserAndNeverReused: the same id from two users
// is two requests; a user's id reused for another SKU or qty gets 422 and
// changes nothing; a repeat with the same SKU and qty gets the first
// order, in single deducts, batches (in order), wait=none, with the
// Idempotency-Key header, and across deducts and lottery entries.
func TestRequestID_ScopedToTheUserAndNeverReused(t *testing.T) {
	n := nodetest.StartNode(t, t.TempDir())
	cl := nodetest.ClientOf(n, 4)
	for _, sku := range []string{"phone", "tablet"} {
		if code, body := nodetest.Call(t, cl, "PUT", "/v1/skus/"+sku, `{"total":100}`); code != 201 {
			t.Fatalf("create %s: %d %v", sku, code, body)
		}
	}
	deduct := func(sku, body string) (int, map[string]any) {
		t.Helper()
		path, query, _ := strings.Cut(sku, "?")
		if query != "" {
			query = "?" + query
		}
		return nodetest.Call(t, cl, "POST", "/v1/skus/"+path+"/deduct"+query, body)
	}
	f := func(sku, body string, wantCode int, wantErr string) map[string]any {
		t.Helper()
		code, out := deduct(sku, body)
		if code != wantCode || wantErr != "" && out["error"] != wantErr {
			t.Fatalf("deduct %s %s: %d %v, want %d %s", sku, body, code, out, wantCode, wantErr)
		}
		return out
	}

	alice := f("phone", `{"user":"alice","qty":1,"request_id":"r-1"}`, 200, "")
	bob := f("tablet", `{"user":"bob","qty":2,"request_id":"r-1"}`, 200, "")
	if bob["order_id"] == alice["order_id"] || bob["sku"] != "tablet" || bob["qty"] != 2.0 {
		t.Fatalf("bob's r-1 answered %v; alice's order is %v", bob, alice)
	}
	if again := f("phone", `{"user":"alice","qty":1,"request_id":"r-1"}`, 200, ""); again["order_id"] != alice["order_id"] {
		t.Fatalf("alice's repeat answered %v, want her order %v", again, alice["order_id"])
	}
	f("tablet", `{"user":"alice","qty":1,"request_id":"r-1"}`, 422, "request_id_reused")
	f("phone", `{"user":"alice","qty":2,"request_id":"r-1"}`, 422, "request_id_reused")
	f("phone", `{"user":"alice","request_id":"r-1"}`, 200, "") // qty left out is one unit: the same request
	if code, o := nodetest.Call(t, cl, "GET", "/v1/orders/"+alice["order_id"].(string), ""); code != 200 || o["user"] != "alice" || o["state"] != "sold" {
		t.Fatalf("alice's order after the refusals: %d %v", code, o)
	}
	if p, tb := soldOf(t, cl, "phone"), soldOf(t, cl, "tablet"); p != 1 || tb != 2 {
		t.Fatalf("sold phone %v tablet %v after the refusals, want 1 and 2", p, tb)
	}

	// The Idempotency-Key header names the request id; a body id that
	// differs is refused.
	code, byHeader := callWithHeader(t, cl, "POST", "/v1/skus/phone/deduct", `{"user":"carol"}`, "Idempotency-Key", "k-1")
	if code != 200 {
		t.Fatalf("deduct by Idempotency-Key: %d %v", code, byHeader)
	}
	if again := f("phone", `{"user":"carol","request_id":"k-1"}`, 200, ""); again["order_id"] != byHeader["order_id"] {
		t.Fatalf("the body id k-1 answered %v; the header's order is %v", again, byHeader["order_id"])
	}
	if code, out := callWithHeader(t, cl, "POST", "/v1/skus/phone/deduct", `{"user":"carol","request_id":"k-2"}`, "Idempotency-Key", "k-1"); code != 400 {
		t.Fatalf("header and body ids that differ: %d %v", code, out)
	}
	if code, out := callWithHeader(t, cl, "POST", "/v1/skus/tablet/deduct", `{"user":"carol"}`, "Idempotency-Key", "k-1"); code != 422 {
		t.Fatalf("header id reused for another sku: %d %v", code, out)
	}

	// A batch is judged in order: a later item reusing an earlier item's
	// user and id with another SKU gets 422, one with the same SKU and qty
	// the earlier item's order, another user's the same id its own.
	code, results, body := postBatch(t, cl, `{"deducts":[
		{"sku":"phone","user":"dave","request_id":"b-1"},
		{"sku":"tablet","user":"dave","request_id":"b-1"},
		{"sku":"phone","user":"dave","request_id":"b-1"},
		{"sku":"phone","user":"erin","request_id":"b-1"},
		{"sku":"phone","user":"dave","qty":3,"request_id":"b-1"}]}`)
	if code != 200 || len(results) != 5 {
		t.Fatalf("batch: %d %s", code, body)
	}
	for i, want := range []int{200, 422, 200, 200, 422} {
		if results[i].Status != want {
			t.Fatalf("batch item %d: %d, want %d (%s)", i, results[i].Status, want, body)
		}
	}
	if results[2].OrderID != results[0].OrderID || results[3].OrderID == results[0].OrderID || results[1].Error != "request_id_reused" {
		t.Fatalf("batch answers: %s", body)
	}
	if code, _, body := postBatch(t, cl, `{"deducts":[{"sku":"phone","user":"dave","request_id":"b-1"}]}`); code != 200 || !strings.Contains(body, results[0].OrderID) {
		t.Fatalf("a batch repeating dave's b-1: %d %s, want his order %s", code, body, results[0].OrderID)
	}
	if code, _ := callWithHeader(t, cl, "POST", "/v1/deducts", `{"deducts":[]}`, "Idempotency-Key", "k-9"); code != 400 {
		t.Fatalf("Idempotency-Key on a batch: %d, want 400", code)
	}

	// wait=none: the pending order and the ledger's alike refuse a reuse.
	noWait := f("phone?wait=none", `{"user":"frank","request_id":"n-1"}`, 202, "")
	f("tablet?wait=none", `{"user":"frank","request_id":"n-1"}`, 422, "request_id_reused")
	nodetest.WaitFor(t, 10*time.Second, "frank's order sold", func() bool {
		_, o := nodetest.Call(t, cl, "GET", "/v1/orders/"+noWait["order_id"].(string), "")
		return o["state"] == "sold"
	})
	f("tablet", `{"user":"frank","request_id":"n-1"}`, 422, "request_id_reused")
	if again := f("phone", `{"user":"frank","request_id":"n-1"}`, 200, ""); again["order_id"] != noWait["order_id"] {
		t.Fatalf("frank's repeat after commit: %v, want %v", again, noWait["order_id"])
	}

	// Deducts and lottery entries share a user's ids.
	closeAt := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	if code, out := nodetest.Call(t, cl, "PUT", "/v1/skus/draw", `{"total":5,"mode":"lottery","entries_close_at":"`+closeAt+`"}`); code != 201 {
		t.Fatalf("create the lottery: %d %v", code, out)
	}
	enter := func(body string, want int) map[string]any {
		t.Helper()
		code, out := nodetest.Call(t, cl, "POST", "/v1/skus/draw/enter", body)
		if code != want {
			t.Fatalf("enter %s: %d %v, want %d", body, code, out, want)
		}
		return out
	}
	if out := enter(`{"user":"alice","request_id":"r-1"}`, 422); out["error"] != "request_id_reused" {
		t.Fatalf("alice's entry with the id she bought with: %v", out)
	}
	enter(`{"user":"gina","request_id":"e-1"}`, 202)
	f("phone", `{"user":"gina","request_id":"e-1"}`, 422, "request_id_reused")
	enter(`{"user":"gina","request_id":"e-2"}`, 202) // her first entry, whatever the id
	if code, out := callWithHeader(t, cl, "POST", "/v1/skus/draw/enter", `{"user":"hank"}`, "Idempotency-Key", "h-1"); code != 202 {
		t.Fatalf("entry by Idempotency-Key: %d %v", code, out)
	}
	f("tablet", `{"user":"hank","request_id":"h-1"}`, 422, "request_id_reused")

	// What the refusals left: each sale's law, and the units sold.
	if p, tb := soldOf(t, cl, "phone"), soldOf(t, cl, "tablet"); p != 5 || tb != 2 {
		t.Fatalf("sold phone %v tablet %v at the end, want 5 (alice, carol, dave, erin, frank) and 2 (bob)", p, tb)
	}
	nodetest.CheckLedger(t, cl, "draw")
}

// TestRequestID_ReuseRacingOnTwoNodes: each user sends one request id to
// two nodes at once, for two SKUs; the ledger decides: one order, one
// 422. With wait=none both may answer 202; the one the ledger refuses
// then reads released, turned_down_request_id_reused.
func TestRequestID_ReuseRacingOnTwoNodes(t *testing.T) {
	c := nodetest.StartCluster(t)
	leader := c.Leader()
	for _, sku := range []string{"phone", "tablet"} {
		if code, body := nodetest.Call(t, c.Client(leader), "PUT", "/v1/skus/"+sku, `{"total":1000}`); code != 201 {
			t.Fatalf("create %s: %d %v", sku, code, body)
		}
		nodetest.WaitSaleEverywhere(t, c, sku)
	}
	const users = 150
	for _, mode := range []string{"", "?wait=none"} {
		type answer struct {
			code  int
			order string
		}
		answers := make([][2]answer, users)
		var wg sync.WaitGroup
		for u := range users {
			for side, sku := range []string{"phone", "tablet"} {
				wg.Add(1)
				go func() {
					defer wg.Done()
					node := c.NodeIDs()[side]
					body := fmt.Sprintf(`{"user":"u%d","request_id":"race%s"}`, u, mode)
					// A 503, 504 or 429 is retried with the same id, bounded.
					for try := 0; try < 50; try++ {
						code, out := nodetest.CallWithin(c.Client(node), 15*time.Second, "POST", "/v1/skus/"+sku+"/deduct"+mode, body)
						id, _ := out["order_id"].(string)
						answers[u][side] = answer{code, id}
						if code != 503 && code != 504 && code != 429 && code != 0 {
							return
						}
						time.Sleep(20 * time.Millisecond) // a client's backoff, not a wait for a condition
					}
				}()
			}
		}
		wg.Wait()
		for u, a := range answers {
			codes := [2]int{a[0].code, a[1].code}
			switch {
			case mode == "" && !(codes == [2]int{200, 422} || codes == [2]int{422, 200}):
				t.Fatalf("user u%d: answers %v, want one 200 and one 422 (the last of each side's tries)", u, codes)
			case mode != "" && (codes[0] != 202 && codes[0] != 422 || codes[1] != 202 && codes[1] != 422 || codes == [2]int{422, 422}):
				t.Fatalf("user u%d with wait=none: answers %v", u, codes)
			}
		}
		if mode == "" {
			continue
		}
		// Every 202 order settles: exactly one sold per user.
		turnedDown := 0
		defer func() {
			t.Logf("wait=none: %d of %d users had both calls answered 202, one turned down by the ledger", turnedDown, users)
		}()
		for u, a := range answers {
			sold := 0
			for side := range a {
				if a[side].code != 202 {
					continue
				}
				node := c.NodeIDs()[side]
				var o map[string]any
				nodetest.WaitFor(t, 10*time.Second, "order "+a[side].order+" settled", func() bool {
					_, o = nodetest.Call(t, c.Client(node), "GET", "/v1/orders/"+a[side].order, "")
					return o["state"] == "sold" || o["state"] == "released"
				})
				switch {
				case o["state"] == "sold":
					sold++
				case o["release_reason"] == "turned_down_request_id_reused":
					turnedDown++
				default:
					t.Fatalf("user u%d: order %v released for %v", u, a[side].order, o["release_reason"])
				}
			}
			if sold != 1 {
				t.Fatalf("user u%d: %d of the racing wait=none orders sold, want 1: %v", u, sold, a)
			}
		}
	}
	p := checkClusterLedgers(t, c, "phone", nil)["sold"].(float64)
	tb := checkClusterLedgers(t, c, "tablet", nil)["sold"].(float64)
	if p+tb != 2*users {
		t.Fatalf("sold phone %v + tablet %v, want %d: one unit per user and mode", p, tb, 2*users)
	}
}

// TestSale_TimesTheLedgerCannotHoldAreRefused: start_at and
// entries_close_at outside int64 nanoseconds get 400 naming the field and
// create nothing; entries_close_at already past gets 400; a past start_at
// in range opens the sale now and reads back exactly as sent.
func TestSale_TimesTheLedgerCannotHoldAreRefused(t *testing.T) {
	n := nodetest.StartNode(t, t.TempDir())
	cl := nodetest.ClientOf(n, 2)
	f := func(sku, body, field string) {
		t.Helper()
		code, out := nodetest.Call(t, cl, "PUT", "/v1/skus/"+sku, body)
		if code != 400 || !strings.Contains(fmt.Sprint(out["detail"]), field) {
			t.Fatalf("PUT %s %s: %d %v, want 400 naming %s", sku, body, code, out, field)
		}
		if code, _ := nodetest.Call(t, cl, "GET", "/v1/skus/"+sku, ""); code != 404 {
			t.Fatalf("refused sale %s exists: %d", sku, code)
		}
	}
	future := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	f("far", `{"total":10,"start_at":"9999-12-31T23:59:59Z"}`, "start_at")
	f("early", `{"total":10,"start_at":"0001-01-01T00:00:00Z"}`, "start_at")
	f("late-draw", `{"total":1,"mode":"lottery","entries_close_at":"9999-12-31T23:59:59Z"}`, "entries_close_at")
	f("old-draw", `{"total":1,"mode":"lottery","entries_close_at":"1000-01-01T00:00:00Z"}`, "entries_close_at")
	f("past-draw", `{"total":1,"mode":"lottery","entries_close_at":"2020-01-01T00:00:00Z"}`, "entries_close_at")
	f("long-hold", `{"total":1,"hold_ttl":"8760h"}`, "hold_ttl")
	if code, out := nodetest.Call(t, cl, "PUT", "/v1/skus/soon", `{"total":1,"mode":"lottery","start_at":"`+future+`","entries_close_at":"`+future+`"}`); code != 400 {
		t.Fatalf("lottery closing at its start: %d %v", code, out)
	}

	const past = "2001-02-03T04:05:06.123456789Z"
	code, out := nodetest.Call(t, cl, "PUT", "/v1/skus/opened", `{"total":3,"start_at":"`+past+`"}`)
	if code != 201 || out["start_at"] != past || out["state"] != "open" {
		t.Fatalf("sale with a past start_at: %d %v", code, out)
	}
	if _, got := nodetest.Call(t, cl, "GET", "/v1/skus/opened", ""); got["start_at"] != past {
		t.Fatalf("start_at reads back %v, sent %s", got["start_at"], past)
	}
	if code, out := nodetest.Call(t, cl, "POST", "/v1/skus/opened/deduct", `{"user":"u1","request_id":"r1"}`); code != 200 {
		t.Fatalf("deduct from a sale whose start_at is past: %d %v", code, out)
	}
	// The last second the ledger holds is a start time like any other.
	if code, out := nodetest.Call(t, cl, "PUT", "/v1/skus/edge", `{"total":1,"start_at":"2262-04-11T23:47:16Z"}`); code != 201 || out["state"] != "upcoming" {
		t.Fatalf("start_at at the end of the range: %d %v", code, out)
	}
	if code, out := nodetest.Call(t, cl, "POST", "/v1/skus/edge/deduct", `{"user":"u1"}`); code != 425 {
		t.Fatalf("deduct before a far start: %d %v", code, out)
	}
	if soldOf(t, cl, "opened") != 1 || soldOf(t, cl, "edge") != 0 {
		t.Fatal("sold counts after the time checks")
	}
}
