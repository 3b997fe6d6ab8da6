package raftfsm

import (
	"context"
	"log/slog"
	"os"
	"testing"
	"time"
)

// testLogger routes logs into the test's output.
func testLogger(tb testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(tbWriter{tb}, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

type tbWriter struct{ tb testing.TB }

func (w tbWriter) Write(p []byte) (int, error) { w.tb.Log(string(p)); return len(p), nil }

func startTestNode(t *testing.T, dir string) (*Node, *Ledger) {
	t.Helper()
	l, err := OpenLedger(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.Dir = dir
	cfg.RaftBind = "127.0.0.1:0"
	cfg.Logger = testLogger(t)
	cfg.HeartbeatTimeout, cfg.ElectionTimeout, cfg.LeaderLeaseTimeout = 200*time.Millisecond, 200*time.Millisecond, 100*time.Millisecond
	n, err := StartNode(cfg, l)
	if err != nil {
		l.Close()
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := n.WaitLeader(ctx); err != nil {
		t.Fatal(err)
	}
	return n, l
}

func mustPropose(t *testing.T, n *Node, c legacyCommand) *Result {
	t.Helper()
	var res *Result
	var err error
	// The first proposals after an election can race leadership settling.
	deadline := time.Now().Add(10 * time.Second)
	for {
		typed, terr := c.typed()
		if terr != nil {
			t.Fatal(terr)
		}
		res, err = n.Propose(c.AtUnixNano, typed)
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("propose %s: %v", c.Op, err)
	}
	return res
}

func TestNode_RestartKeepsLedgerAndAppliesNothingTwice(t *testing.T) {
	dir := t.TempDir()
	n, l := startTestNode(t, dir)
	mustPropose(t, n, legacyCommand{Op: OpCreateSale, SKU: "a", Sale: &SaleConfig{Total: 100}})
	if r := mustPropose(t, n, legacyCommand{Op: OpLease, Node: "n1", SKU: "a", Qty: 30}); r.Qty != 30 {
		t.Fatalf("lease %d", r.Qty)
	}
	r := mustPropose(t, n, legacyCommand{Op: OpTake, Node: "n1", Takes: []TakeEntry{
		{SKU: "a", Qty: 1, User: "u1", RequestID: "r1", OrderID: "o1"},
		{SKU: "a", Qty: 2, User: "u2", RequestID: "r2", OrderID: "o2"},
	}})
	if r.Takes[0].Outcome != OutcomeOK || r.Takes[1].Outcome != OutcomeOK {
		t.Fatalf("takes: %+v", r.Takes)
	}
	// A snapshot in the middle makes the restart replay only the tail.
	if err := n.Snapshot(); err != nil {
		t.Fatal(err)
	}
	mustPropose(t, n, legacyCommand{Op: OpRestock, SKU: "a", Qty: 10})
	before, _, _ := l.SKU("a")
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}

	n2, l2 := startTestNode(t, dir)
	defer func() { n2.Close(); l2.Close() }()
	// A barrier makes the new leader apply everything committed before.
	if err := n2.Barrier(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	after, _, _ := l2.SKU("a")
	if after.Total != before.Total || after.Sold != before.Sold || after.Leased["n1"] != before.Leased["n1"] || after.Available != before.Available {
		t.Fatalf("restart changed the row:\nbefore %+v\nafter  %+v", before, after)
	}
	if after.Total != 110 || after.Sold != 3 {
		t.Fatalf("row %+v, want total 110 sold 3", after)
	}
	r = mustPropose(t, n2, legacyCommand{Op: OpTake, Node: "n1", Takes: []TakeEntry{{SKU: "a", Qty: 1, User: "u1", RequestID: "r1", OrderID: "o9"}}})
	if r.Takes[0].Outcome != OutcomeSame || r.Takes[0].Order.ID != "o1" {
		t.Fatalf("request r1 after restart: %s %q, want same o1", r.Takes[0].Outcome, r.Takes[0].Order.ID)
	}
	checkAudit(t, l2, "a")
}

func TestNode_LedgerLostIsRebuiltFromSnapshot(t *testing.T) {
	dir := t.TempDir()
	n, l := startTestNode(t, dir)
	mustPropose(t, n, legacyCommand{Op: OpCreateSale, SKU: "a", Sale: &SaleConfig{Total: 5}})
	if err := n.Snapshot(); err != nil {
		t.Fatal(err)
	}
	n.Close()
	l.Close()
	// An operator deletes the ledger file but keeps raft's data.
	if err := os.Remove(l.path); err != nil {
		t.Fatal(err)
	}
	n3, l3 := startTestNode(t, dir)
	defer func() { n3.Close(); l3.Close() }()
	if s, _, ok := l3.SKU("a"); !ok || s.Total != 5 {
		t.Fatalf("sku after rebuild: %+v %v", s, ok)
	}
	checkAudit(t, l3, "a")
}
