package httpapi

import (
	"context"
	"fmt"
	"net"
	"stockd.dev/stockd/engine/control"
	"testing"

	"github.com/valyala/fasthttp"

	"stockd.dev/stockd/engine"
	"stockd.dev/stockd/stock"
)

// countingEngine counts every call that would change the ledger.
type countingEngine struct {
	*fakeEngine
	changes int
}

func (c *countingEngine) CreateSale(string, control.SaleSpec) (bool, error) {
	c.changes++
	return true, nil
}
func (c *countingEngine) Restock(string, int64) error { c.changes++; return nil }
func (c *countingEngine) Confirm(string) (stock.Order, error) {
	c.changes++
	return stock.Order{ID: "o"}, nil
}
func (c *countingEngine) Cancel(string) (stock.Order, error) {
	c.changes++
	return stock.Order{ID: "o"}, nil
}
func (c *countingEngine) Reclaim(string) (int64, error) { c.changes++; return 0, nil }
func (c *countingEngine) Deduct(req *engine.DeductRequest, res *engine.DeductResult) {
	c.changes++
	c.fakeEngine.Deduct(req, res)
}

// leaderCluster is a one-node cluster that leads and counts membership
// changes.
type leaderCluster struct{ changes *int }

func (l leaderCluster) Status() ClusterStatus { return ClusterStatus{NodeID: "n1", Leader: "n1"} }
func (l leaderCluster) IsLeader() bool        { return true }
func (l leaderCluster) LeaderReadIndex(context.Context) (uint64, error) {
	return 0, nil
}
func (l leaderCluster) AddVoter(string, string) error {
	*l.changes++
	return nil
}
func (l leaderCluster) RemoveServer(string) error { *l.changes++; return nil }

// secretPeers is a node's Peers that hears a peer by the cluster secret
// header (peer.Service's own checks are peer's tests).
type secretPeers struct {
	alone
	secret string
}

func (p secretPeers) FromPeer(ctx *fasthttp.RequestCtx) bool {
	return p.secret != "" && string(ctx.Request.Header.Peek("X-Stockd-Cluster-Secret")) == p.secret
}

// TestAuth_EveryStateChangingRoute calls every public route that changes
// state with no credential, a wrong one and the right one, from loopback
// and from another machine's address, on a node with every credential
// set and on one with none, and checks that a refused call changed
// nothing. (The internal routes' credentials are peer's tests.)
func TestAuth_EveryStateChangingRoute(t *testing.T) {
	const adminToken, serviceToken, secret = "admin-t", "service-t", "cluster-s"
	type guard int
	const (
		guardAdmin guard = iota
		guardService
	)
	routes := []struct {
		method, path, body string
		guard              guard
	}{
		{"PUT", "/v1/skus/a", `{"total":5}`, guardAdmin},
		{"POST", "/v1/skus/a/restock", `{"qty":5}`, guardAdmin},
		{"POST", "/v1/cluster/join", `{"id":"n9","raft_addr":"127.0.0.1:7009"}`, guardAdmin},
		{"DELETE", "/v1/cluster/nodes/n2", "", guardAdmin},
		{"POST", "/v1/orders/n1-1-x/confirm", "", guardService},
		{"POST", "/v1/orders/n1-1-x/cancel", "", guardService},
		{"POST", "/v1/skus/a/deduct", `{"user":"u","request_id":"r"}`, guardService},
	}
	remoteOther := &net.TCPAddr{IP: net.IPv4(10, 1, 2, 3), Port: 5000}
	for _, configured := range []bool{true, false} {
		cfg := DefaultConfig()
		if configured {
			cfg.AdminToken, cfg.ServiceToken = adminToken, serviceToken
			cfg.Peers = secretPeers{secret: secret}
		}
		eng := &countingEngine{fakeEngine: &fakeEngine{status: engine.StatusOK}}
		s, err := New(cfg, eng, leaderCluster{&eng.changes}, "test")
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range routes {
			for _, remote := range []net.Addr{loopback, remoteOther} {
				for _, cred := range []string{"none", "wrong", "right"} {
					ctx := newCtx(r.method, r.path, r.body, remote)
					var want bool
					switch r.guard {
					case guardAdmin:
						if cred == "right" {
							ctx.Request.Header.Set("Authorization", "Bearer "+adminToken)
						}
						want = (configured && cred == "right") || (!configured && remote == loopback)
					case guardService:
						if cred == "right" {
							ctx.Request.Header.Set("Authorization", "Bearer "+serviceToken)
						}
						want = !configured || cred == "right"
					}
					if cred == "wrong" {
						ctx.Request.Header.Set("Authorization", "Bearer nope")
						ctx.Request.Header.Set("X-Stockd-Cluster-Secret", "nope")
					}
					before := eng.changes
					s.handle(ctx)
					code := ctx.Response.StatusCode()
					changed := eng.changes != before
					name := fmt.Sprintf("configured=%v %s %s from %s with %s credential", configured, r.method, r.path, remote, cred)
					switch {
					case want && (!changed || code == 401 || code == 403):
						t.Errorf("%s: %d, changed=%v; want it allowed", name, code, changed)
					case !want && changed:
						t.Errorf("%s: %d and the call went through; want it refused", name, code)
					case !want && code != 401 && code != 403 && code != 404:
						t.Errorf("%s: %d; want 401, 403 or 404", name, code)
					}
				}
			}
		}
	}
}

// TestAuth_RelayedLoopbackNeedsTheSecret: a follower relays an admin call
// of its loopback client with X-Stockd-Relayed-Loopback; the leader
// believes it only beside the cluster secret.
func TestAuth_RelayedLoopbackNeedsTheSecret(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Peers = secretPeers{secret: "cluster-s"}
	eng := &countingEngine{fakeEngine: &fakeEngine{}}
	s, err := New(cfg, eng, leaderCluster{&eng.changes}, "test")
	if err != nil {
		t.Fatal(err)
	}
	remote := &net.TCPAddr{IP: net.IPv4(10, 1, 2, 3), Port: 5000}
	f := func(secret string, want int) {
		t.Helper()
		ctx := newCtx("PUT", "/v1/skus/a", `{"total":5}`, remote)
		ctx.Request.Header.Set(headerRelayedLoopback, "1")
		if secret != "" {
			ctx.Request.Header.Set("X-Stockd-Cluster-Secret", secret)
		}
		before := eng.changes
		s.handle(ctx)
		if code := ctx.Response.StatusCode(); code != want || (want == fasthttp.StatusCreated) != (eng.changes > before) {
			t.Fatalf("relayed with secret %q: %d (changes %d -> %d), want %d", secret, code, before, eng.changes, want)
		}
	}
	f("", fasthttp.StatusForbidden)
	f("wrong", fasthttp.StatusForbidden)
	f("cluster-s", fasthttp.StatusCreated)
}
