// Package nodetest is the multi-node test harness, beside node as
// httptest is beside net/http: in-process nodes and clusters over real
// loopback TCP whose links a test can cut, stall or slow (FaultNet), and
// the HTTP helpers the tests call them with. Only tests import it
// (internal/layout checks); it is the one package besides main that
// imports node, and its arrows point down (node, raftnode, raftfsm).
package nodetest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"stockd.dev/stockd/node"
	"stockd.dev/stockd/raftfsm"
)

// Record, when set, sees every exchange the helpers make (the scenario
// tests check them against the OpenAPI document).
var Record = func(req *fasthttp.Request, resp *fasthttp.Response) {}

// tbWriter sends a node's log lines to its test's log until the test's
// last cleanup; a node that outlives its test (a leaked one) writes to
// nowhere after that, instead of into a finished test.
type tbWriter struct {
	tb       testing.TB
	name     string
	mu       sync.Mutex
	closed   bool
	reported bool
}

func newTBWriter(tb testing.TB) *tbWriter {
	w := &tbWriter{tb: tb, name: tb.Name()}
	// Registered before the node's stop, so it runs after it: the node's
	// last lines still reach the test.
	tb.Cleanup(func() {
		w.mu.Lock()
		w.closed = true
		w.mu.Unlock()
	})
	return w
}

func (w *tbWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case !w.closed:
		w.tb.Log(string(bytes.TrimSpace(p)))
	case !w.reported:
		// Said once, on the test binary's stderr: which test left a node
		// (or a goroutine of one) running, and what it was doing.
		w.reported = true
		fmt.Fprintf(os.Stderr, "nodetest: a node of %s logged after the test ended: %s\n", w.name, bytes.TrimSpace(p))
	}
	return len(p), nil
}

// startTestNode runs a real node on loopback ports and dir.
func StartNode(t *testing.T, dir string) *node.Node {
	t.Helper()
	return StartNodeWith(t, dir, nil)
}

// StartNodeWith is StartNode with its config changed by tune first.
func StartNodeWith(t *testing.T, dir string, tune func(*node.Config)) *node.Node {
	t.Helper()
	cfg := NodeConfig(t, "n1", dir, 200*time.Millisecond)
	if tune != nil {
		tune(&cfg)
	}
	n, err := node.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Stop(context.Background()) })
	WaitFor(t, 10*time.Second, "node ready, its ledger on this binary's rules", func() bool {
		code, _ := Call(t, ClientOf(n, 1), "GET", "/readyz", "")
		return code == 200 && n.Ledger().Rules() == raftfsm.RulesCurrent
	})
	return n
}

// testNodeConfig is a node on loopback ports with its data in dir, two
// buckets per SKU and short raft timeouts, logging warnings to the test.
func NodeConfig(tb testing.TB, id, dir string, raftTimeout time.Duration) node.Config {
	cfg := node.DefaultConfig()
	cfg.ID, cfg.DataDir = id, dir
	cfg.HTTP.Addr, cfg.Raft.RaftBind = "127.0.0.1:0", "127.0.0.1:0"
	cfg.ClusterSecret = ClusterSecret
	cfg.Engine.BucketsPerSKU = 2
	cfg.Raft.HeartbeatTimeout, cfg.Raft.ElectionTimeout, cfg.Raft.LeaderLeaseTimeout = raftTimeout, raftTimeout, raftTimeout/2
	cfg.Logger = slog.New(slog.NewTextHandler(newTBWriter(tb), &slog.HandlerOptions{Level: slog.LevelWarn})).With("node", id)
	return cfg
}

// testClusterSecret is the -cluster-secret of in-process test nodes.
const ClusterSecret = "test-cluster-secret"

// clientOf is a client of n's HTTP server with up to conns connections.
func ClientOf(n *node.Node, conns int) *fasthttp.HostClient {
	return &fasthttp.HostClient{Addr: n.HTTPAddr(), MaxConns: conns, ReadTimeout: 15 * time.Second, WriteTimeout: 5 * time.Second, DialDualStack: true}
}

func WaitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// CallHeader is Call with one more request header (empty name: none),
// quiet about transport errors (code 0) and about answers that are not
// JSON (a nil map), for callers that expect them: a node being killed,
// a refusal's raw body.
func CallHeader(c *fasthttp.HostClient, method, path, body, name, value string) (int, map[string]any) {
	var code int
	var out map[string]any
	exchange(c, method, path, body, name, value, 20*time.Second, func(_ *fasthttp.Request, resp *fasthttp.Response) {
		code = resp.StatusCode()
		json.Unmarshal(resp.Body(), &out)
	})
	return code, out
}

func Call(t testing.TB, c *fasthttp.HostClient, method, path, body string) (int, map[string]any) {
	var code int
	var out map[string]any
	err := exchange(c, method, path, body, "", "", 0, func(req *fasthttp.Request, resp *fasthttp.Response) {
		Record(req, resp)
		code = resp.StatusCode()
		if err := json.Unmarshal(resp.Body(), &out); err != nil {
			t.Errorf("%s %s: answer %q is not JSON: %v", method, path, resp.Body(), err)
		}
	})
	if err != nil {
		t.Errorf("%s %s: %v", method, path, err)
	}
	return code, out
}

// exchange sends one request to c's node, with one more header unless
// name is empty, within timeout (0: the client's own), and hands the
// answer to use before the request and answer are released.
func exchange(c *fasthttp.HostClient, method, path, body, name, value string, timeout time.Duration, use func(*fasthttp.Request, *fasthttp.Response)) error {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(URL(c, path))
	req.Header.SetMethod(method)
	if name != "" {
		req.Header.Set(name, value)
	}
	if body != "" {
		req.SetBodyString(body)
	}
	var err error
	if timeout > 0 {
		err = c.DoTimeout(req, resp, timeout)
	} else {
		err = c.Do(req, resp)
	}
	if err != nil {
		return err
	}
	use(req, resp)
	return nil
}

// checkLedger asserts the conservation law and the order recount over HTTP
// and returns the audit.
func CheckLedger(t *testing.T, c *fasthttp.HostClient, sku string) map[string]any {
	t.Helper()
	code, a := Call(t, c, "GET", "/v1/skus/"+sku+"/audit", "")
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

func GetRaw(t *testing.T, c *fasthttp.HostClient, path string) string {
	t.Helper()
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(URL(c, path))
	err := c.Do(req, resp)
	if err != nil || resp.StatusCode() != 200 {
		t.Fatalf("GET %s: %d %v", path, resp.StatusCode(), err)
	}
	Record(req, resp)
	return string(resp.Body())
}

// callQuiet is call without failing the test on transport errors, which
// are expected while nodes crash.
func CallQuiet(c *fasthttp.HostClient, method, path, body string) (int, map[string]any) {
	return CallWithin(c, 15*time.Second, method, path, body)
}

// callWithin is one call bounded by timeout. Code 0: no answer (transport
// error or timeout).
func CallWithin(c *fasthttp.HostClient, timeout time.Duration, method, path, body string) (int, map[string]any) {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(URL(c, path))
	req.Header.SetMethod(method)
	req.SetBodyString(body)
	if err := c.DoTimeout(req, resp, timeout); err != nil {
		return 0, nil
	}
	Record(req, resp)
	var out map[string]any
	_ = json.Unmarshal(resp.Body(), &out)
	return resp.StatusCode(), out
}

// URL is path on c's node: https when c speaks TLS.
func URL(c *fasthttp.HostClient, path string) string {
	if c.IsTLS {
		return "https://" + c.Addr + path
	}
	return "http://" + c.Addr + path
}
