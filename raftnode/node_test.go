package raftnode

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"stockd.dev/stockd/raftfsm"
	"stockd.dev/stockd/raftfsm/command"
	"stockd.dev/stockd/stock"
	"sync/atomic"
	"testing"
	"time"
	"weak"
)

// testLogger routes logs into the test's output.
func testLogger(tb testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(tbWriter{tb}, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

type tbWriter struct{ tb testing.TB }

func (w tbWriter) Write(p []byte) (int, error) { w.tb.Log(string(p)); return len(p), nil }

func startTestNode(t *testing.T, dir string) (*Node, *raftfsm.Ledger) {
	t.Helper()
	l, err := raftfsm.OpenLedger(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	return startTestNodeOn(t, dir, l)
}

// startTestNodeOn starts a single raft node over an open ledger and
// returns once it leads and has committed its new term's barrier
// (catchUpAsLeader): a barrier that landed after a test's first
// proposal would make the snapshot's index run one past the ledger's.
func startTestNodeOn(t *testing.T, dir string, l *raftfsm.Ledger) (*Node, *raftfsm.Ledger) {
	t.Helper()
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
	for !n.CommitHealthy() {
		if ctx.Err() != nil {
			t.Fatal("the leader did not commit its term's barrier in 10 s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	return n, l
}

func mustPropose(t *testing.T, n *Node, c command.Command) *command.Result {
	t.Helper()
	var res *command.Result
	var err error
	// The first proposals after an election can race leadership settling.
	deadline := time.Now().Add(10 * time.Second)
	for {
		res, err = n.Propose(1, c)
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("propose %s: %v", c.Op(), err)
	}
	return res
}

// checkAudit asserts the conservation law and the order recount.
func checkAudit(t *testing.T, l *raftfsm.Ledger, sku string) {
	t.Helper()
	a, ok, err := l.AuditSKU(sku)
	if err != nil || !ok || !a.OK {
		t.Fatalf("audit %s: %+v %v %v", sku, a, ok, err)
	}
}

func TestNode_RestartKeepsLedgerAndAppliesNothingTwice(t *testing.T) {
	dir := t.TempDir()
	n, l := startTestNode(t, dir)
	mustPropose(t, n, &command.CreateSale{SKU: "a", Sale: stock.SaleConfig{Total: 100}})
	if r := mustPropose(t, n, &command.Lease{Node: "n1", SKU: "a", Want: 30}); r.Qty != 30 {
		t.Fatalf("lease %d", r.Qty)
	}
	r := mustPropose(t, n, &command.Take{Node: "n1", Entries: []command.TakeEntry{
		{SKU: "a", Qty: 1, User: "u1", RequestID: "r1", OrderID: "o1"},
		{SKU: "a", Qty: 2, User: "u2", RequestID: "r2", OrderID: "o2"},
	}})
	if r.Takes[0].Outcome != stock.OutcomeOK || r.Takes[1].Outcome != stock.OutcomeOK {
		t.Fatalf("takes: %+v", r.Takes)
	}
	// A snapshot in the middle makes the restart replay only the tail.
	if err := n.Snapshot(); err != nil {
		t.Fatal(err)
	}
	mustPropose(t, n, &command.Restock{SKU: "a", Qty: 10})
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
	r = mustPropose(t, n2, &command.Take{Node: "n1", Entries: []command.TakeEntry{{SKU: "a", Qty: 1, User: "u1", RequestID: "r1", OrderID: "o9"}}})
	if r.Takes[0].Outcome != stock.OutcomeSame || r.Takes[0].Order.ID != "o1" {
		t.Fatalf("request r1 after restart: %s %q, want same o1", r.Takes[0].Outcome, r.Takes[0].Order.ID)
	}
	checkAudit(t, l2, "a")
}

// TestNode_ProposalQueuedAtShutdownReturns: raft never answers a proposal
// still queued for its leader loop when it shuts down. A node crashing
// mid-sale in the nemesis hung for good: its engine waited for a lease
// proposal stuck that way. Propose must return once raft is down.
func TestNode_ProposalQueuedAtShutdownReturns(t *testing.T) {
	dir := t.TempDir()
	l, err := raftfsm.OpenLedger(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	var armed atomic.Bool
	release := make(chan struct{})
	cfg := DefaultConfig()
	cfg.Dir, cfg.RaftBind, cfg.Logger = dir, "127.0.0.1:0", testLogger(t)
	cfg.HeartbeatTimeout, cfg.ElectionTimeout, cfg.LeaderLeaseTimeout = 200*time.Millisecond, 200*time.Millisecond, 100*time.Millisecond
	// Once armed, an append blocks until released and then fails: the
	// leader loop is stuck in it while more proposals queue behind.
	cfg.LogFault = func() error {
		if armed.Load() {
			<-release
			return errors.New("disk gone")
		}
		return nil
	}
	n, err := StartNode(cfg, l)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := n.WaitLeader(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Propose(1, &command.CreateSale{SKU: "a", Sale: stock.SaleConfig{Total: 10}}); err != nil {
		t.Fatal(err)
	}
	armed.Store(true)
	results := make(chan error, 8)
	for range cap(results) {
		go func() {
			_, err := n.Propose(2, &command.Restock{SKU: "a", Qty: 1})
			results <- err
		}()
	}
	closed := make(chan error, 1)
	go func() { closed <- n.Close() }()
	close(release)
	<-closed
	deadline := time.After(10 * time.Second)
	for range cap(results) {
		select {
		case err := <-results:
			if err == nil {
				t.Fatal("a proposal succeeded while every append failed")
			}
		case <-deadline:
			t.Fatal("a proposal queued when raft shut down never returned")
		}
	}
}

// TestNode_ProposalResultsAreNotKeptByRaft: raft's log cache keeps a
// pointer into each proposal's future, and so its response; the results
// a caller got (a Take's orders) must be collectable once the caller
// drops them, not 128 entries later.
func TestNode_ProposalResultsAreNotKeptByRaft(t *testing.T) {
	n, l := startTestNode(t, t.TempDir())
	defer func() { n.Close(); l.Close() }()
	mustPropose(t, n, &command.CreateSale{SKU: "a", Sale: stock.SaleConfig{Total: 1000}})
	mustPropose(t, n, &command.Lease{Node: "n1", SKU: "a", Want: 1000})
	entries := make([]command.TakeEntry, 100)
	for i := range entries {
		entries[i] = command.TakeEntry{SKU: "a", Qty: 1, User: fmt.Sprint("u", i), RequestID: fmt.Sprint("r", i), OrderID: fmt.Sprint("o", i)}
	}
	r := mustPropose(t, n, &command.Take{Node: "n1", Entries: entries})
	if len(r.Takes) != len(entries) || r.Takes[99].Outcome != stock.OutcomeOK {
		t.Fatalf("take results: %d, last %+v", len(r.Takes), r.Takes[len(r.Takes)-1])
	}
	results := weak.Make(&r.Takes[0])
	r = nil
	deadline := time.Now().Add(10 * time.Second)
	for results.Value() != nil {
		if time.Now().After(deadline) {
			t.Fatal("the Take's results are still reachable after the caller dropped them: raft keeps them")
		}
		runtime.GC()
	}
	checkAudit(t, l, "a")
}

// TestNode_CommittedProposalCutOffByShutdownIsOutcomeUnknown: raft hands
// committed entries to the ledger through a queue of 128 batches; a
// leader whose ledger is slow fills it, and its leader loop then waits to
// hand over the next committed batch. Shut down then, raft answers that
// batch's proposals ErrRaftShutdown, which said "nothing was proposed"
// (503 unavailable to the caller) for an entry that is committed: the
// nemesis saw a confirm answered 503 that had sold its order.
// A proposal whose entry reached the log answers ErrOutcomeUnknown
// unless it succeeded.
func TestNode_CommittedProposalCutOffByShutdownIsOutcomeUnknown(t *testing.T) {
	const fsmQueueBatches = 128 // raft's fsmMutateCh
	n, l := startTestNode(t, t.TempDir())
	defer l.Close()
	mustPropose(t, n, &command.CreateSale{SKU: "a", Sale: stock.SaleConfig{Total: 10}})
	// The first batch handed over sleeps in the ledger while the queue
	// fills behind it.
	l.SetApplyDelay(5 * time.Second)
	type proposal struct {
		inLog bool // its entry reached the leader's log
		err   chan error
	}
	var sent []*proposal
	for range 2 * fsmQueueBatches {
		before := n.raft.LastIndex()
		p := &proposal{err: make(chan error, 1)}
		sent = append(sent, p)
		go func() {
			_, err := n.Propose(2, &command.Restock{SKU: "a", Qty: 1})
			p.err <- err
		}()
		// One proposal at a time, so that each commits as a batch of
		// its own.
		deadline := time.Now().Add(time.Second)
		for n.raft.LastIndex() == before && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		if p.inLog = n.raft.LastIndex() != before; !p.inLog {
			break // the leader loop waits on the full queue
		}
	}
	if len(sent) < fsmQueueBatches+2 || sent[len(sent)-1].inLog {
		t.Fatalf("%d proposals entered the log one by one and the leader loop never blocked: the test did not fill raft's queue", len(sent))
	}
	l.SetApplyDelay(0)
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	unknown := 0
	for i, p := range sent {
		var err error
		select {
		case err = <-p.err:
		case <-time.After(10 * time.Second):
			t.Fatalf("proposal %d never returned after the shutdown", i)
		}
		switch {
		case !p.inLog || err == nil:
		case errors.Is(err, ErrOutcomeUnknown):
			unknown++
		default:
			t.Errorf("proposal %d, committed, answered %v: as if nothing had been proposed", i, err)
		}
	}
	if unknown == 0 {
		t.Fatal("no committed proposal was cut off by the shutdown: the test did not exercise it")
	}
}

// TestNode_ReadIndexOnTheQuorumAndOnTheLease: a leader of a caught-up term
// answers both with its applied index, which holds a write it just
// applied; a leader that has stepped down answers neither.
func TestNode_ReadIndexOnTheQuorumAndOnTheLease(t *testing.T) {
	n, l := startTestNode(t, t.TempDir())
	mustPropose(t, n, &command.CreateSale{SKU: "a", Sale: stock.SaleConfig{Total: 3}})
	applied := l.AppliedIndex()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	quorum, err := n.ReadIndex(ctx)
	if err != nil || quorum < applied {
		t.Fatalf("ReadIndex: %d %v, want at least %d", quorum, err, applied)
	}
	lease, err := n.LeaseReadIndex()
	if err != nil || lease < applied {
		t.Fatalf("LeaseReadIndex: %d %v, want at least %d", lease, err, applied)
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := n.LeaseReadIndex(); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("LeaseReadIndex after shutdown: %v, want ErrNotLeader", err)
	}
	if _, err := n.ReadIndex(ctx); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("ReadIndex after shutdown: %v, want ErrNotLeader", err)
	}
	checkAudit(t, l, "a")
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestNode_ReadIndexCoversACommitTheLedgerHasNotApplied: a follower told
// of a commit may apply the entry before the leader's own ledger does, and
// show it; the leader's read index is then the committed entry's, not its
// ledger's applied index, so a node catching up to it shows no less. A
// barrier (or a no-op) at the log's tail moves no ledger: the read index
// stays on the last entry a ledger applies, which a reader reaches.
func TestNode_ReadIndexCoversACommitTheLedgerHasNotApplied(t *testing.T) {
	n, l := startTestNode(t, t.TempDir())
	t.Cleanup(func() { n.Close(); l.Close() })
	mustPropose(t, n, &command.CreateSale{SKU: "a", Sale: stock.SaleConfig{Total: 3}})
	before := l.AppliedIndex()

	l.SetApplyDelay(2 * time.Second)
	done := make(chan error, 1)
	go func() {
		_, err := n.Propose(1, &command.Restock{SKU: "a", Qty: 1})
		done <- err
	}()
	deadline := time.Now().Add(5 * time.Second)
	for n.raft.CommitIndex() <= before {
		if time.Now().After(deadline) {
			t.Fatal("the restock did not commit in 5 s")
		}
		time.Sleep(time.Millisecond)
	}
	committed := n.raft.CommitIndex()
	lease, err := n.LeaseReadIndex()
	applied := l.AppliedIndex()
	if applied >= committed {
		t.Fatalf("the ledger applied %d before the test looked: the delay did not hold it back", applied)
	}
	if err != nil || lease < committed {
		t.Fatalf("LeaseReadIndex with the restock committed at %d and the ledger at %d: %d %v, want %d", committed, applied, lease, err, committed)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if quorum, err := n.ReadIndex(ctx); err != nil || quorum < committed {
		t.Fatalf("ReadIndex with the restock committed at %d: %d %v", committed, quorum, err)
	}
	l.SetApplyDelay(0)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := l.WaitApplied(ctx, lease); err != nil {
		t.Fatal(err)
	}

	if err := n.Barrier(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	if n.raft.CommitIndex() <= l.AppliedIndex() {
		t.Fatalf("the barrier moved nothing: commit %d, ledger %d", n.raft.CommitIndex(), l.AppliedIndex())
	}
	lease, err = n.LeaseReadIndex()
	if err != nil || lease != l.AppliedIndex() {
		t.Fatalf("LeaseReadIndex after a barrier: %d %v, want the ledger's %d (the barrier at %d moves no ledger)", lease, err, l.AppliedIndex(), n.raft.CommitIndex())
	}
	checkAudit(t, l, "a")
}
