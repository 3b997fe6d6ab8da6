package raftfsm_test

// A crash between a commit and the ledger's write: this needs a raft node
// (package raftnode, which imports raftfsm), hence a test package of its
// own.

import (
	"fmt"
	"testing"
	"time"

	"stockd.dev/stockd/raftfsm"
	"stockd.dev/stockd/raftfsm/command"
	"stockd.dev/stockd/raftnode"
	"stockd.dev/stockd/stock"
)

func startRaftNode(t *testing.T, dir string, l *raftfsm.Ledger) *raftnode.Node {
	t.Helper()
	cfg := raftnode.DefaultConfig()
	cfg.Dir, cfg.RaftBind = dir, "127.0.0.1:0"
	cfg.HeartbeatTimeout, cfg.ElectionTimeout, cfg.LeaderLeaseTimeout = 200*time.Millisecond, 200*time.Millisecond, 100*time.Millisecond
	n, err := raftnode.StartNode(cfg, l)
	if err != nil {
		l.Close()
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !n.IsLeader() {
		if time.Now().After(deadline) {
			t.Fatal("no leader after 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	return n
}

func openRaftNode(t *testing.T, dir string) (*raftnode.Node, *raftfsm.Ledger) {
	t.Helper()
	l, err := raftfsm.OpenLedger(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	return startRaftNode(t, dir, l), l
}

func propose(t *testing.T, n *raftnode.Node, c command.Command) *command.Result {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		res, err := n.Propose(1, c)
		if err == nil {
			return res
		}
		if time.Now().After(deadline) {
			t.Fatalf("propose %s: %v", c.Op(), err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestNode_CrashBetweenCommitAndLedgerWrite: acknowledged takes whose
// ledger changes never reached bbolt (the process died in the
// write-behind window) are all there after a restart, applied once.
func TestNode_CrashBetweenCommitAndLedgerWrite(t *testing.T) {
	dir := t.TempDir()
	n, l := openRaftNode(t, dir)
	propose(t, n, &command.CreateSale{SKU: "a", Sale: stock.SaleConfig{Total: 1000}})
	if err := l.Flush(); err != nil {
		t.Fatal(err)
	}
	// From here on nothing reaches ledger.db: the persister is stopped and
	// Close will not flush, as if the process died after each commit.
	raftfsm.HaltPersister(l)
	propose(t, n, &command.Lease{Node: "n1", SKU: "a", Want: 600})
	acked := map[string]bool{}
	for batch := range 20 {
		var takes []command.TakeEntry
		for i := range 25 {
			id := fmt.Sprintf("o%d-%d", batch, i)
			takes = append(takes, command.TakeEntry{SKU: "a", Qty: 1, User: "u" + id, RequestID: "r" + id, OrderID: id})
		}
		r := propose(t, n, &command.Take{Node: "n1", Entries: takes})
		for i, tr := range r.Takes {
			if tr.Outcome != stock.OutcomeOK {
				t.Fatalf("take %s: %s", takes[i].OrderID, tr.Outcome)
			}
			acked[takes[i].OrderID] = true
		}
	}
	before, _, _ := l.SKU("a")
	if entries, _ := l.PersistLag(); entries == 0 {
		t.Fatal("nothing was left unpersisted: the test did not open the window")
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}

	l2, err := raftfsm.OpenLedger(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	if s, _, _ := l2.SKU("a"); s.Sold != 0 {
		t.Fatalf("ledger.db holds %d sold: the crash window was not simulated", s.Sold)
	}
	n2 := startRaftNode(t, dir, l2)
	defer func() { n2.Close(); l2.Close() }()
	if err := n2.Barrier(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	after, _, _ := l2.SKU("a")
	if after.Sold != 500 || after.Sold != before.Sold || after.Leased["n1"] != before.Leased["n1"] || after.Available != before.Available {
		t.Fatalf("after the replay:\nbefore %+v\nafter  %+v", before, after)
	}
	for id := range acked {
		if o, ok, err := l2.Order(id); err != nil || !ok || o.State != stock.OrderSold {
			t.Fatalf("acknowledged order %s after the crash: %+v %v %v", id, o, ok, err)
		}
	}
	// Written through now, and the same after one more restart.
	if err := l2.Flush(); err != nil {
		t.Fatal(err)
	}
	if a, ok, err := l2.AuditSKU("a"); err != nil || !ok || !a.OK {
		t.Fatalf("audit: %+v %v %v", a, ok, err)
	}
}
