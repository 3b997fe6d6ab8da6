package control

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"stockd.dev/stockd/engine"
	"stockd.dev/stockd/raftfsm"
	"stockd.dev/stockd/raftfsm/command"
	"stockd.dev/stockd/raftnode"
	"stockd.dev/stockd/stock"
)

type tbWriter struct{ tb testing.TB }

func (w tbWriter) Write(p []byte) (int, error) { w.tb.Log(string(p)); return len(p), nil }

// testNode is a control plane over an engine over a real single-node raft
// ledger in a temp dir.
type testNode struct {
	t      *testing.T
	ledger *raftfsm.Ledger
	node   *raftnode.Node
	plane  *Plane
}

func startTestNode(t *testing.T, dir string, tune func(*engine.Config)) *testNode {
	t.Helper()
	return startTestNodeWrapped(t, dir, tune, nil)
}

// startTestNodeWrapped is startTestNode with the ledger the control plane
// reads wrapped by wrapLedger (nil: the ledger itself).
func startTestNodeWrapped(t *testing.T, dir string, tune func(*engine.Config), wrapLedger func(*raftfsm.Ledger) Ledger) *testNode {
	t.Helper()
	logger := slog.New(slog.NewTextHandler(tbWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	ledger, err := raftfsm.OpenLedger(dir, logger)
	if err != nil {
		t.Fatal(err)
	}
	cfg := engine.DefaultConfig()
	cfg.Logger = logger
	if tune != nil {
		tune(&cfg)
	}
	e, err := engine.New(cfg, ledger)
	if err != nil {
		t.Fatal(err)
	}
	var read Ledger = ledger
	if wrapLedger != nil {
		read = wrapLedger(ledger)
	}
	p := New(e, read)
	rc := raftnode.DefaultConfig()
	rc.Dir, rc.RaftBind, rc.Logger = dir, "127.0.0.1:0", logger
	rc.HeartbeatTimeout, rc.ElectionTimeout, rc.LeaderLeaseTimeout = 200*time.Millisecond, 200*time.Millisecond, 100*time.Millisecond
	node, err := raftnode.StartNode(rc, ledger)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := node.WaitLeader(ctx); err != nil {
		t.Fatal(err)
	}
	if err := node.Barrier(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	e.Start(raftProposer{node})
	p.Start()
	tn := &testNode{t: t, ledger: ledger, node: node, plane: p}
	t.Cleanup(tn.stop)
	return tn
}

// raftProposer proposes straight to a raft node, its errors mapped onto
// the engine's sentinels as node's Proposer maps them.
type raftProposer struct{ n *raftnode.Node }

func (p raftProposer) Propose(at int64, c command.Command) (*command.Result, error) {
	res, err := p.n.Propose(at, c)
	switch {
	case err == nil:
		return res, nil
	case errors.Is(err, raftnode.ErrOutcomeUnknown):
		return nil, fmt.Errorf("%w: %w", engine.ErrOutcomeUnknown, err)
	default:
		return nil, fmt.Errorf("%w: %w", engine.ErrUnavailable, err)
	}
}

func (tn *testNode) stop() {
	if tn.plane == nil {
		return
	}
	tn.plane.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := tn.plane.Engine.Close(ctx); err != nil {
		tn.t.Errorf("close engine: %v", err)
	}
	if err := tn.node.Close(); err != nil {
		tn.t.Errorf("close node: %v", err)
	}
	if err := tn.ledger.Close(); err != nil {
		tn.t.Errorf("close ledger: %v", err)
	}
	tn.plane = nil
}

func (tn *testNode) deduct(sku, user, requestID string, qty int64, noWait bool) engine.DeductResult {
	req := engine.DeductRequest{SKU: []byte(sku), User: []byte(user), RequestID: []byte(requestID), Qty: qty, NoWait: noWait}
	var res engine.DeductResult
	tn.plane.Deduct(&req, &res)
	return res
}

// checkLedger asserts the conservation law and the order recount, and
// returns the audit.
func (tn *testNode) checkLedger(sku string) stock.Audit {
	tn.t.Helper()
	a, _, ok, err := tn.plane.Audit(sku)
	if err != nil || !ok || !a.OK {
		tn.t.Fatalf("audit %s: ok=%v err=%v audit=%+v", sku, ok, err, a)
	}
	return a
}

type fakeClock struct{ offset atomic.Int64 }

func (c *fakeClock) now() time.Time          { return time.Now().Add(time.Duration(c.offset.Load())) }
func (c *fakeClock) advance(d time.Duration) { c.offset.Add(int64(d)) }

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
