package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"stockd.dev/stockd/engine"
	"stockd.dev/stockd/raftfsm"
	"stockd.dev/stockd/raftnode"
	"stockd.dev/stockd/stock"
)

// testConfig is a single node on loopback ports chosen by the system,
// its data in dir.
func testConfig(dir string) Config {
	cfg := DefaultConfig()
	cfg.DataDir = dir
	cfg.HTTP.Addr = "127.0.0.1:0"
	cfg.Raft.RaftBind = "127.0.0.1:0"
	cfg.Raft.HeartbeatTimeout, cfg.Raft.ElectionTimeout, cfg.Raft.LeaderLeaseTimeout = 200*time.Millisecond, 200*time.Millisecond, 100*time.Millisecond
	return cfg
}

// do sends one HTTP call to n and decodes its JSON answer.
func do(t *testing.T, n *Node, method, path, body string) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(method, "http://"+n.HTTPAddr()+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var out map[string]any
	json.Unmarshal(b, &out)
	return resp.StatusCode, out
}

func startNode(t *testing.T, cfg Config) *Node {
	t.Helper()
	n, err := Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		if code, _ := do(t, n, "GET", "/readyz", ""); code == 200 {
			return n
		}
		if time.Now().After(deadline) {
			t.Fatal("the node is not ready after 15s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestNode_SellsStopsAndStartsAgainOnItsData: one node serves a sale,
// stops (draining), and a node started on the same data dir holds every
// sale it answered, with the ledger's law intact.
func TestNode_SellsStopsAndStartsAgainOnItsData(t *testing.T) {
	dir := t.TempDir()
	n := startNode(t, testConfig(dir))
	if code, body := do(t, n, "PUT", "/v1/skus/tee", `{"total":5}`); code != 201 {
		t.Fatalf("create: %d %v", code, body)
	}
	orders := map[string]bool{}
	for i := range 7 {
		code, body := do(t, n, "POST", "/v1/skus/tee/deduct", fmt.Sprintf(`{"user":"u%d","request_id":"r%d"}`, i, i))
		switch {
		case i < 5 && code == 200:
			orders[body["order_id"].(string)] = true
		case i >= 5 && code == 409 && body["error"] == "sold_out":
		default:
			t.Fatalf("deduct %d: %d %v", i, code, body)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := n.Stop(ctx); err != nil {
		t.Fatal(err)
	}

	n2 := startNode(t, testConfig(dir))
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		n2.Stop(ctx)
	}()
	a, ok, err := n2.Ledger().AuditSKU("tee")
	if err != nil || !ok || !a.OK || a.Row.Sold != 5 || a.Row.Available != 0 || a.Row.Total != 5 {
		t.Fatalf("after the restart: %+v %v %v", a, ok, err)
	}
	for id := range orders {
		if o, ok, err := n2.Ledger().Order(id); err != nil || !ok || o.State != stock.OrderSold {
			t.Fatalf("order %s after the restart: %+v %v %v", id, o, ok, err)
		}
	}
	// A repeat of an answered request id gets its order back.
	code, body := do(t, n2, "POST", "/v1/skus/tee/deduct", `{"user":"u0","request_id":"r0"}`)
	if code != 200 || !orders[body["order_id"].(string)] {
		t.Fatalf("a repeat after the restart: %d %v", code, body)
	}
}

// TestNode_StopEndsItsListenersSweepers: a stopped node, with the event
// loop and without, leaves no coarse-deadline sweeper behind (one was
// left by every start with the loop: the listener it had wrapped, and
// then not served, was never closed). The node sells out first, its
// ledger keeping the law.
func TestNode_StopEndsItsListenersSweepers(t *testing.T) {
	for _, loop := range []bool{true, false} {
		t.Run(fmt.Sprintf("loop=%v", loop), func(t *testing.T) {
			cfg := testConfig(t.TempDir())
			cfg.DeductLoop = loop
			n := startNode(t, cfg)
			if code, body := do(t, n, "PUT", "/v1/skus/tee", `{"total":2}`); code != 201 {
				t.Fatalf("create: %d %v", code, body)
			}
			for i := range 3 {
				code, body := do(t, n, "POST", "/v1/skus/tee/deduct", fmt.Sprintf(`{"user":"u%d"}`, i))
				want := 200
				if i >= 2 {
					want = 409
				}
				if code != want {
					t.Fatalf("deduct %d: %d %v, want %d", i, code, body, want)
				}
			}
			a, ok, err := n.Ledger().AuditSKU("tee")
			if err != nil || !ok || !a.OK || a.Row.Sold != 2 || a.Row.Available != 0 || a.OrdersSold != 2 {
				t.Fatalf("the ledger: %+v %v %v", a, ok, err)
			}
			http.DefaultClient.CloseIdleConnections()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := n.Stop(ctx); err != nil {
				t.Fatal(err)
			}
			deadline := time.Now().Add(5 * time.Second)
			for {
				buf := make([]byte, 1<<20)
				stacks := string(buf[:runtime.Stack(buf, true)])
				if !strings.Contains(stacks, "coarsedeadline.(*Listener).sweep") {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("5 s after the stop a listener's sweeper still runs:\n%s", stacks)
				}
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
}

func TestConfig_ValidateNamesWhatCannotWork(t *testing.T) {
	for _, c := range []struct {
		tune func(*Config)
		want string
	}{
		{func(c *Config) { c.ID = "n/1" }, "a node id is"},
		{func(c *Config) { c.DataDir = "" }, "data dir"},
		{func(c *Config) { c.Peers = []Peer{{ID: "n1", Addr: "127.0.0.1:1"}}; c.Join = "http://x" }, "exclude each other"},
		{func(c *Config) { c.Peers = []Peer{{ID: "n1", Addr: "127.0.0.1:1"}} }, "needs node certificates (-node-cert, -node-key, -node-ca) or, on loopback, -cluster-secret"},
		// Secure by default: a raft address other machines reach needs node
		// certificates, alone or not, unless the operator opts out by name.
		{func(c *Config) { c.Raft.RaftBind = "0.0.0.0:7000" }, "needs node certificates: make certificates with `stockd cert ca"},
		{func(c *Config) { c.Raft.RaftBind = "10.1.2.3:7000" }, "to run on plain TCP anyway pass -insecure-plaintext-cluster"},
		{func(c *Config) {
			c.ClusterSecret = "s"
			c.Peers = []Peer{{ID: "n1", Addr: "192.0.2.1:7000"}}
		}, "-raft 192.0.2.1:7000 is reachable from other machines"},
		{func(c *Config) { c.TLS.NodeCert = "n1.pem" }, "need all three of -node-cert, -node-key and -node-ca"},
		{func(c *Config) { c.TLS.HTTPCert = "n1.pem" }, "HTTPS needs both -http-cert and -http-key"},
		{func(c *Config) { c.TLS.HTTPClientCA = "ca.pem" }, "give -http-cert and -http-key too"},
		{func(c *Config) {
			c.TLS = TLSFiles{NodeCert: "a", NodeKey: "b", NodeCA: "c"}
			c.ClusterSecret = "s"
		}, "drop the secret"},
		{func(c *Config) { c.DrainTimeout = 0 }, "drain timeout"},
		{func(c *Config) { c.HTTP.Addr = ":8080" }, "need -admin-token"},
		{func(c *Config) { c.Engine.NodeID = "n2" }, "the node id (set Config.ID) is a setting of the node"},
		{func(c *Config) { c.Raft.Dir = "/elsewhere" }, "the data dir (set Config.DataDir) is a setting of the node"},
	} {
		cfg := testConfig(t.TempDir())
		c.tune(&cfg)
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("want %q, got %v", c.want, err)
		}
	}
	cfg := testConfig(t.TempDir())
	if err := cfg.Validate(); err != nil {
		t.Fatalf("the test's own config: %v", err)
	}
	// The opt-out: plain TCP on a reachable address, with the secret.
	cfg.Raft.RaftBind, cfg.InsecurePlaintextCluster, cfg.ClusterSecret = "0.0.0.0:7000", true, "s"
	cfg.Peers = []Peer{{ID: cfg.ID, Addr: "192.0.2.1:7000"}}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("-insecure-plaintext-cluster: %v", err)
	}
}

// TestTranslate_RaftErrorsBecomeTheEngines: every way a proposal fails
// reaches the engine as one of its sentinels, which say whether it may
// have been applied.
func TestTranslate_RaftErrorsBecomeTheEngines(t *testing.T) {
	for _, c := range []struct {
		err, want error
	}{
		{raftnode.ErrNotLeader, engine.ErrUnavailable},
		{raftnode.ErrShutdown, engine.ErrUnavailable},
		{raftnode.ErrBusy, engine.ErrUnavailable},
		{fmt.Errorf("%w: leadership lost", raftnode.ErrOutcomeUnknown), engine.ErrOutcomeUnknown},
		{fmt.Errorf("%w: bad op", raftfsm.ErrMalformed), engine.ErrRejected},
	} {
		if got := translate(c.err); !errors.Is(got, c.want) {
			t.Errorf("%v became %v, want %v", c.err, got, c.want)
		}
	}
	if translate(nil) != nil {
		t.Error("no error became one")
	}
}
