package scenario

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"stockd.dev/stockd/node"
	"stockd.dev/stockd/node/nodetest"

	"github.com/valyala/fasthttp"
)

func TestServer_FlashSaleEndToEnd(t *testing.T) {
	const units, buyers, conns = 1000, 20000, 200
	dir := t.TempDir()
	n := nodetest.StartNode(t, dir)
	c := nodetest.ClientOf(n, conns)
	if code, body := nodetest.Call(t, c, "PUT", "/v1/skus/phone", fmt.Sprintf(`{"total":%d}`, units)); code != 201 {
		t.Fatalf("create sale: %d %v", code, body)
	}

	var mu sync.Mutex
	outcomes := map[string]int{}
	orderOwner := map[string]int{}
	var wg sync.WaitGroup
	for w := 0; w < conns; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for b := w; b < buyers; b += conns {
				code, body := nodetest.Call(t, c, "POST", "/v1/skus/phone/deduct", fmt.Sprintf(`{"user":"u%d","qty":1,"request_id":"r%d"}`, b, b))
				key := fmt.Sprintf("%d %v", code, body["error"])
				if code == 503 {
					key += fmt.Sprint(" ", body["detail"])
				}
				mu.Lock()
				outcomes[key]++
				if code == 200 {
					id := body["order_id"].(string)
					if prev, dup := orderOwner[id]; dup {
						t.Errorf("order %s sold to buyers %d and %d", id, prev, b)
					}
					orderOwner[id] = b
				}
				mu.Unlock()
			}
		}(w)
	}
	wg.Wait()
	if outcomes["200 <nil>"] != units || outcomes["409 sold_out"] != buyers-units || len(outcomes) != 2 {
		t.Fatalf("outcomes %v, want %d × 200 and %d × 409 sold_out", outcomes, units, buyers-units)
	}
	a := nodetest.CheckLedger(t, c, "phone")
	if a["sold"].(float64)+a["held"].(float64) != units || a["orders"].(float64) != units {
		t.Fatalf("ledger after sale: %v", a)
	}
	metricsText := nodetest.GetRaw(t, c, "/metrics")
	for _, want := range []string{
		fmt.Sprintf(`stockd_deducts_total{outcome="sold_out"} %d`, buyers-units),
		fmt.Sprintf(`stockd_deducts_total{outcome="ok"} %d`, units),
		fmt.Sprintf(`stockd_deduct_duration_seconds_count %d`, buyers),
		fmt.Sprintf(`stockd_lease_granted_units_total %d`, units),
		`stockd_raft_state{state="Leader"} 1`,
	} {
		if !strings.Contains(metricsText, want+"\n") {
			t.Fatalf("/metrics lacks %q:\n%s", want, metricsText)
		}
	}
	// A winner retrying gets the same order, once.
	var winner, winnerOrder = -1, ""
	for id, b := range orderOwner {
		winner, winnerOrder = b, id
		break
	}
	retry := fmt.Sprintf(`{"user":"u%d","qty":1,"request_id":"r%d"}`, winner, winner)
	if code, body := nodetest.Call(t, c, "POST", "/v1/skus/phone/deduct", retry); code != 200 || body["order_id"] != winnerOrder {
		t.Fatalf("retry of a winner: %d %v, want 200 %s", code, body, winnerOrder)
	}

	// Stop and start again on the same directory.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := n.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	n2 := nodetest.StartNode(t, dir)
	c2 := nodetest.ClientOf(n2, 4)
	code, sku := nodetest.Call(t, c2, "GET", "/v1/skus/phone", "")
	if code != 200 || sku["sold"].(float64) != units || sku["remaining"].(float64) != 0 || sku["state"] != "sold_out" {
		t.Fatalf("sku after restart: %d %v", code, sku)
	}
	if code, body := nodetest.Call(t, c2, "POST", "/v1/skus/phone/deduct", `{"user":"late","qty":1,"request_id":"late-1"}`); code != 409 || body["error"] != "sold_out" {
		t.Fatalf("deduct after restart: %d %v, want 409 sold_out", code, body)
	}
	if code, body := nodetest.Call(t, c2, "POST", "/v1/skus/phone/deduct", retry); code != 200 || body["order_id"] != winnerOrder {
		t.Fatalf("retry after restart: %d %v, want 200 %s", code, body, winnerOrder)
	}
	if code, o := nodetest.Call(t, c2, "GET", "/v1/orders/"+winnerOrder, ""); code != 200 || o["state"] != "sold" || o["user"] != fmt.Sprintf("u%d", winner) {
		t.Fatalf("order after restart: %d %v", code, o)
	}
	a = nodetest.CheckLedger(t, c2, "phone")
	if a["sold"].(float64)+a["held"].(float64) != units || a["orders"].(float64) != units {
		t.Fatalf("ledger after restart: %v", a)
	}
}

func TestServer_BadInputGetsClear4xx(t *testing.T) {
	n := nodetest.StartNode(t, t.TempDir())
	c := nodetest.ClientOf(n, 2)
	if code, _ := nodetest.Call(t, c, "PUT", "/v1/skus/a", `{"total":5}`); code != 201 {
		t.Fatalf("create: %d", code)
	}
	f := func(method, path, body string, wantCode int, wantErr string) {
		t.Helper()
		code, out := nodetest.Call(t, c, method, path, body)
		if code != wantCode || out["error"] != wantErr {
			t.Fatalf("%s %s %q: %d %v, want %d %s", method, path, body, code, out, wantCode, wantErr)
		}
	}
	f("POST", "/v1/skus/a/deduct", `{"user":"u","qty":0}`, 400, "bad_request")
	f("POST", "/v1/skus/a/deduct", `{"user":"u","qty":-3}`, 400, "bad_request")
	f("POST", "/v1/skus/a/deduct", `{"user":"u","qty":1e12}`, 400, "bad_request")
	f("POST", "/v1/skus/a/deduct", `{"user":"u","qty":1.5}`, 400, "bad_request")
	f("POST", "/v1/skus/a/deduct", `{"user":"u","qty":"1"}`, 400, "bad_request")
	f("POST", "/v1/skus/a/deduct", `{"qty":1}`, 400, "bad_request")
	f("POST", "/v1/skus/a/deduct", `{"user":7}`, 400, "bad_request")
	f("POST", "/v1/skus/a/deduct", `[1,2]`, 400, "bad_request")
	f("POST", "/v1/skus/a/deduct", `{"user":"u"`, 400, "bad_request")
	f("POST", "/v1/skus/a/deduct?wait=later", `{"user":"u"}`, 400, "bad_request")
	f("POST", "/v1/skus/nope/deduct", `{"user":"u"}`, 404, "unknown_sku")
	f("POST", "/v1/skus/b%20c/deduct", `{"user":"u"}`, 400, "bad_request")
	f("GET", "/v1/skus/a/deduct", ``, 405, "method_not_allowed")
	f("PUT", "/v1/skus/a", `{"total":6}`, 409, "conflict")
	f("PUT", "/v1/skus/b", `{}`, 400, "bad_request")
	f("PUT", "/v1/skus/b", `{"total":-1}`, 400, "bad_request")
	f("PUT", "/v1/skus/b", `{"total":1,"totl":2}`, 400, "bad_request")
	f("PUT", "/v1/skus/b", `{"total":1,"start_at":"tomorrow"}`, 400, "bad_request")
	f("PUT", "/v1/skus/b", `{"total":1,"hold_ttl":"soon"}`, 400, "bad_request")
	f("POST", "/v1/skus/nope/restock", `{"qty":1}`, 404, "unknown_sku")
	f("POST", "/v1/skus/a/restock", `{"qty":0}`, 400, "bad_request")
	f("GET", "/v1/skus/nope", ``, 404, "unknown_sku")
	f("GET", "/v1/orders/nope", ``, 404, "not_found")
	f("GET", "/v2/anything", ``, 404, "not_found")
	f("POST", "/v1/skus/a/deduct", `{"user":"`+string(bytes.Repeat([]byte("x"), 20<<10))+`"}`, 413, "too_large")

	start := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	if code, _ := nodetest.Call(t, c, "PUT", "/v1/skus/later", `{"total":5,"start_at":"`+start+`"}`); code != 201 {
		t.Fatalf("create later: %d", code)
	}
	f("POST", "/v1/skus/later/deduct", `{"user":"u"}`, 425, "not_started")
	if code, s := nodetest.Call(t, c, "GET", "/v1/skus/later", ""); code != 200 || s["state"] != "upcoming" || s["starts_in_ms"].(float64) <= 0 {
		t.Fatalf("upcoming sale: %d %v", code, s)
	}
	// Nothing above sold anything.
	if a := nodetest.CheckLedger(t, c, "a"); a["sold"].(float64) != 0 {
		t.Fatalf("bad requests sold units: %v", a)
	}
}

func TestServer_AdminTokenGuardsAdminCalls(t *testing.T) {
	cfg := nodetest.NodeConfig(t, "n1", t.TempDir(), 200*time.Millisecond)
	cfg.HTTP.AdminToken = "s3cret"
	n, err := node.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Stop(context.Background())
	c := nodetest.ClientOf(n, 1)
	if code, body := nodetest.Call(t, c, "PUT", "/v1/skus/a", `{"total":1}`); code != 401 || body["error"] != "unauthorized" {
		t.Fatalf("no token: %d %v", code, body)
	}
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI("http://" + n.HTTPAddr() + "/v1/skus/a")
	req.Header.SetMethod("PUT")
	req.Header.Set("Authorization", "Bearer s3cret")
	req.SetBodyString(`{"total":1}`)
	nodetest.WaitFor(t, 10*time.Second, "sale created with the token", func() bool {
		if err := c.Do(req, resp); err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode() == 201
	})
}

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }
