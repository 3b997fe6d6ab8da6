package scenario

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"stockd/node"
	"stockd/raftfsm"

	"github.com/valyala/fasthttp"
)

type tbWriter struct{ tb testing.TB }

func (w tbWriter) Write(p []byte) (int, error) {
	w.tb.Log(string(bytes.TrimSpace(p)))
	return len(p), nil
}

// startTestNode runs a real node on loopback ports and dir.
func startTestNode(t *testing.T, dir string) *node.Node {
	t.Helper()
	n, err := node.Start(testNodeConfig(t, "n1", dir, 200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Stop(context.Background()) })
	waitFor(t, 10*time.Second, "node ready, its ledger on this binary's rules", func() bool {
		code, _ := call(t, clientOf(n, 1), "GET", "/readyz", "")
		return code == 200 && n.Ledger().Rules() == raftfsm.RulesCurrent
	})
	return n
}

// testNodeConfig is a node on loopback ports with its data in dir, two
// buckets per SKU and short raft timeouts, logging warnings to the test.
func testNodeConfig(tb testing.TB, id, dir string, raftTimeout time.Duration) node.Config {
	cfg := node.DefaultConfig()
	cfg.ID, cfg.DataDir = id, dir
	cfg.HTTP.Addr, cfg.Raft.RaftBind = "127.0.0.1:0", "127.0.0.1:0"
	cfg.HTTP.ClusterSecret = testClusterSecret
	cfg.Engine.BucketsPerSKU = 2
	cfg.Raft.HeartbeatTimeout, cfg.Raft.ElectionTimeout, cfg.Raft.LeaderLeaseTimeout = raftTimeout, raftTimeout, raftTimeout/2
	cfg.Logger = slog.New(slog.NewTextHandler(tbWriter{tb}, &slog.HandlerOptions{Level: slog.LevelWarn})).With("node", id)
	return cfg
}

// testClusterSecret is the -cluster-secret of in-process test nodes.
const testClusterSecret = "test-cluster-secret"

// clientOf is a client of n's HTTP server with up to conns connections.
func clientOf(n *node.Node, conns int) *fasthttp.HostClient {
	return &fasthttp.HostClient{Addr: n.HTTPAddr(), MaxConns: conns, ReadTimeout: 15 * time.Second, WriteTimeout: 5 * time.Second}
}

func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func call(t testing.TB, c *fasthttp.HostClient, method, path, body string) (int, map[string]any) {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI("http://" + c.Addr + path)
	req.Header.SetMethod(method)
	if body != "" {
		req.SetBodyString(body)
	}
	if err := c.Do(req, resp); err != nil {
		t.Errorf("%s %s: %v", method, path, err)
		return 0, nil
	}
	contractLog.record(req, resp)
	var out map[string]any
	if err := json.Unmarshal(resp.Body(), &out); err != nil {
		t.Errorf("%s %s: answer %q is not JSON: %v", method, path, resp.Body(), err)
	}
	return resp.StatusCode(), out
}

// checkLedger asserts the conservation law and the order recount over HTTP
// and returns the audit.
func checkLedger(t *testing.T, c *fasthttp.HostClient, sku string) map[string]any {
	t.Helper()
	code, a := call(t, c, "GET", "/v1/skus/"+sku+"/audit", "")
	if code != 200 || a["ok"] != true {
		t.Fatalf("audit %s: %d %v", sku, code, a)
	}
	var leased float64
	for _, v := range a["leased"].(map[string]any) {
		leased += v.(float64)
	}
	if total := a["total"].(float64); total != a["available"].(float64)+leased+a["held"].(float64)+a["sold"].(float64) {
		t.Fatalf("conservation law broken: %v", a)
	}
	return a
}

func TestServer_FlashSaleEndToEnd(t *testing.T) {
	const units, buyers, conns = 1000, 20000, 200
	dir := t.TempDir()
	n := startTestNode(t, dir)
	c := clientOf(n, conns)
	if code, body := call(t, c, "PUT", "/v1/skus/phone", fmt.Sprintf(`{"total":%d}`, units)); code != 201 {
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
				code, body := call(t, c, "POST", "/v1/skus/phone/deduct", fmt.Sprintf(`{"user":"u%d","qty":1,"request_id":"r%d"}`, b, b))
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
	a := checkLedger(t, c, "phone")
	if a["sold"].(float64)+a["held"].(float64) != units || a["orders"].(float64) != units {
		t.Fatalf("ledger after sale: %v", a)
	}
	metricsText := getRaw(t, c, "/metrics")
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
	if code, body := call(t, c, "POST", "/v1/skus/phone/deduct", retry); code != 200 || body["order_id"] != winnerOrder {
		t.Fatalf("retry of a winner: %d %v, want 200 %s", code, body, winnerOrder)
	}

	// Stop and start again on the same directory.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := n.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	n2 := startTestNode(t, dir)
	c2 := clientOf(n2, 4)
	code, sku := call(t, c2, "GET", "/v1/skus/phone", "")
	if code != 200 || sku["sold"].(float64) != units || sku["remaining"].(float64) != 0 || sku["state"] != "sold_out" {
		t.Fatalf("sku after restart: %d %v", code, sku)
	}
	if code, body := call(t, c2, "POST", "/v1/skus/phone/deduct", `{"user":"late","qty":1,"request_id":"late-1"}`); code != 409 || body["error"] != "sold_out" {
		t.Fatalf("deduct after restart: %d %v, want 409 sold_out", code, body)
	}
	if code, body := call(t, c2, "POST", "/v1/skus/phone/deduct", retry); code != 200 || body["order_id"] != winnerOrder {
		t.Fatalf("retry after restart: %d %v, want 200 %s", code, body, winnerOrder)
	}
	if code, o := call(t, c2, "GET", "/v1/orders/"+winnerOrder, ""); code != 200 || o["state"] != "sold" || o["user"] != fmt.Sprintf("u%d", winner) {
		t.Fatalf("order after restart: %d %v", code, o)
	}
	a = checkLedger(t, c2, "phone")
	if a["sold"].(float64)+a["held"].(float64) != units || a["orders"].(float64) != units {
		t.Fatalf("ledger after restart: %v", a)
	}
}

func TestServer_BadInputGetsClear4xx(t *testing.T) {
	n := startTestNode(t, t.TempDir())
	c := clientOf(n, 2)
	if code, _ := call(t, c, "PUT", "/v1/skus/a", `{"total":5}`); code != 201 {
		t.Fatalf("create: %d", code)
	}
	f := func(method, path, body string, wantCode int, wantErr string) {
		t.Helper()
		code, out := call(t, c, method, path, body)
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
	if code, _ := call(t, c, "PUT", "/v1/skus/later", `{"total":5,"start_at":"`+start+`"}`); code != 201 {
		t.Fatalf("create later: %d", code)
	}
	f("POST", "/v1/skus/later/deduct", `{"user":"u"}`, 425, "not_started")
	if code, s := call(t, c, "GET", "/v1/skus/later", ""); code != 200 || s["state"] != "upcoming" || s["starts_in_ms"].(float64) <= 0 {
		t.Fatalf("upcoming sale: %d %v", code, s)
	}
	// Nothing above sold anything.
	if a := checkLedger(t, c, "a"); a["sold"].(float64) != 0 {
		t.Fatalf("bad requests sold units: %v", a)
	}
}

func TestServer_AdminTokenGuardsAdminCalls(t *testing.T) {
	cfg := testNodeConfig(t, "n1", t.TempDir(), 200*time.Millisecond)
	cfg.HTTP.AdminToken = "s3cret"
	n, err := node.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Stop(context.Background())
	c := clientOf(n, 1)
	if code, body := call(t, c, "PUT", "/v1/skus/a", `{"total":1}`); code != 401 || body["error"] != "unauthorized" {
		t.Fatalf("no token: %d %v", code, body)
	}
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI("http://" + n.HTTPAddr() + "/v1/skus/a")
	req.Header.SetMethod("PUT")
	req.Header.Set("Authorization", "Bearer s3cret")
	req.SetBodyString(`{"total":1}`)
	waitFor(t, 10*time.Second, "sale created with the token", func() bool {
		if err := c.Do(req, resp); err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode() == 201
	})
}

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }

func getRaw(t *testing.T, c *fasthttp.HostClient, path string) string {
	t.Helper()
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI("http://" + c.Addr + path)
	err := c.Do(req, resp)
	if err != nil || resp.StatusCode() != 200 {
		t.Fatalf("GET %s: %d %v", path, resp.StatusCode(), err)
	}
	contractLog.record(req, resp)
	return string(resp.Body())
}
