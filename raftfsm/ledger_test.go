package raftfsm

import (
	"bytes"
	"fmt"
	"io"
	"reflect"
	"testing"

	"github.com/hashicorp/raft"
	"pgregory.net/rapid"
)

// testLedger applies commands at increasing log indexes, as raft would.
type testLedger struct {
	tb    testing.TB
	l     *Ledger
	dir   string
	index uint64
}

func newTestLedger(tb testing.TB) *testLedger {
	tb.Helper()
	dir := tb.TempDir()
	l, err := OpenLedger(dir, nil)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { l.Close() })
	return &testLedger{tb: tb, l: l, dir: dir}
}

func logOf(tb testing.TB, index uint64, c Command) *raft.Log {
	tb.Helper()
	b, err := c.Encode()
	if err != nil {
		tb.Fatal(err)
	}
	return &raft.Log{Index: index, Term: 1, Type: raft.LogCommand, Data: b}
}

func (t *testLedger) apply(c Command) *Result {
	t.tb.Helper()
	t.index++
	res, _ := t.l.Apply(logOf(t.tb, t.index, c)).(*Result)
	if res == nil {
		t.tb.Fatalf("apply %s at %d: no result", c.Op, t.index)
	}
	return res
}

func (t *testLedger) row(sku string) SKU {
	t.tb.Helper()
	s, _, ok := t.l.SKU(sku)
	if !ok {
		t.tb.Fatalf("sku %q missing", sku)
	}
	return s
}

// checkAudit asserts the conservation law and that orders recount to the row.
func checkAudit(tb testing.TB, l *Ledger, sku string) Audit {
	tb.Helper()
	a, ok, err := l.AuditSKU(sku)
	if err != nil || !ok {
		tb.Fatalf("audit %q: ok %v err %v", sku, ok, err)
	}
	if !a.OK {
		tb.Fatalf("audit %q failed: %s", sku, a.Problem)
	}
	return a
}

func take(node, sku, user, order string, qty int64) Command {
	return Command{Op: OpTake, Node: node, Takes: []TakeEntry{{SKU: sku, Qty: qty, User: user, RequestID: "req-" + order, OrderID: order}}}
}

func TestLedger_TakeBeyondLeaseIsRejected(t *testing.T) {
	tl := newTestLedger(t)
	tl.apply(Command{Op: OpCreateSale, SKU: "a", Sale: &SaleConfig{Total: 10}})
	if r := tl.apply(Command{Op: OpLease, Node: "n1", SKU: "a", Qty: 3}); r.Qty != 3 {
		t.Fatalf("lease granted %d, want 3", r.Qty)
	}
	r := tl.apply(Command{Op: OpTake, Node: "n1", Takes: []TakeEntry{
		{SKU: "a", Qty: 2, User: "u1", OrderID: "o1"},
		{SKU: "a", Qty: 2, User: "u2", OrderID: "o2"}, // only 1 left in the lease
		{SKU: "a", Qty: 1, User: "u3", OrderID: "o3"},
	}})
	want := []Outcome{OutcomeOK, OutcomeLeaseShort, OutcomeOK}
	for i, w := range want {
		if r.Takes[i].Outcome != w {
			t.Fatalf("entry %d: outcome %s, want %s", i, r.Takes[i].Outcome, w)
		}
	}
	// Another node has no lease at all.
	if r := tl.apply(take("n2", "a", "u4", "o4", 1)); r.Takes[0].Outcome != OutcomeLeaseShort {
		t.Fatalf("take without lease: %s", r.Takes[0].Outcome)
	}
	s := tl.row("a")
	if s.Sold != 3 || s.Available != 7 || s.LeasedTotal() != 0 {
		t.Fatalf("row after takes: %+v", s)
	}
	checkAudit(t, tl.l, "a")
}

func TestLedger_LeaseGrantsAtMostAvailable(t *testing.T) {
	tl := newTestLedger(t)
	tl.apply(Command{Op: OpCreateSale, SKU: "a", Sale: &SaleConfig{Total: 5}})
	if r := tl.apply(Command{Op: OpLease, Node: "n1", SKU: "a", Qty: 4}); r.Qty != 4 {
		t.Fatalf("first lease %d", r.Qty)
	}
	if r := tl.apply(Command{Op: OpLease, Node: "n2", SKU: "a", Qty: 4}); r.Qty != 1 {
		t.Fatalf("second lease %d, want the 1 left", r.Qty)
	}
	if r := tl.apply(Command{Op: OpReturn, Node: "n1", SKU: "a", Qty: 10}); r.Qty != 4 {
		t.Fatalf("return gave back %d, want the 4 leased", r.Qty)
	}
	if r := tl.apply(Command{Op: OpReclaim, Node: "n2"}); r.Qty != 1 {
		t.Fatalf("reclaim took back %d, want 1", r.Qty)
	}
	if s := tl.row("a"); s.Available != 5 {
		t.Fatalf("available %d after return and reclaim, want 5", s.Available)
	}
	checkAudit(t, tl.l, "a")
}

func TestLedger_DuplicateOrderAndRequestIDsApplyOnce(t *testing.T) {
	tl := newTestLedger(t)
	tl.apply(Command{Op: OpCreateSale, SKU: "a", Sale: &SaleConfig{Total: 10}})
	tl.apply(Command{Op: OpLease, Node: "n1", SKU: "a", Qty: 10})
	first := tl.apply(take("n1", "a", "u1", "o1", 1)).Takes[0]
	again := tl.apply(take("n1", "a", "u1", "o1", 1)).Takes[0] // re-proposal, same order id
	if again.Outcome != OutcomeSame || again.Order.ID != first.Order.ID {
		t.Fatalf("re-proposed order: %s %q", again.Outcome, again.Order.ID)
	}
	sameReq := Command{Op: OpTake, Node: "n1", Takes: []TakeEntry{{SKU: "a", Qty: 1, User: "u1", RequestID: "req-o1", OrderID: "o2"}}}
	if r := tl.apply(sameReq).Takes[0]; r.Outcome != OutcomeSame || r.Order.ID != "o1" {
		t.Fatalf("same request id, new order id: %s %q, want same o1", r.Outcome, r.Order.ID)
	}
	if s := tl.row("a"); s.Sold != 1 || s.Leased["n1"] != 9 {
		t.Fatalf("row: %+v", s)
	}
	checkAudit(t, tl.l, "a")
}

func TestLedger_CreateSaleIsIdempotentAndConflicts(t *testing.T) {
	tl := newTestLedger(t)
	f := func(cfg SaleConfig, want Outcome) {
		t.Helper()
		if r := tl.apply(Command{Op: OpCreateSale, SKU: "a", Sale: &cfg}); r.Outcome != want {
			t.Fatalf("create %+v: %s, want %s", cfg, r.Outcome, want)
		}
	}
	f(SaleConfig{Total: 10}, OutcomeOK)
	f(SaleConfig{Total: 10}, OutcomeSame)
	f(SaleConfig{Total: 11}, OutcomeConflict)
	f(SaleConfig{Total: -1}, OutcomeInvalid)
}

func TestLedger_ReopenKeepsStateAndSkipsApplied(t *testing.T) {
	tl := newTestLedger(t)
	var logs []*raft.Log
	for i, c := range []Command{
		{Op: OpCreateSale, SKU: "a", Sale: &SaleConfig{Total: 100}},
		{Op: OpLease, Node: "n1", SKU: "a", Qty: 40},
		take("n1", "a", "u1", "o1", 3),
		{Op: OpRestock, SKU: "a", Qty: 5},
	} {
		logs = append(logs, logOf(t, uint64(i+1), c))
	}
	tl.l.ApplyBatch(logs)
	before := tl.row("a")
	if err := tl.l.Close(); err != nil {
		t.Fatal(err)
	}

	l2, err := OpenLedger(tl.dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l2.Close()
	if got := l2.AppliedIndex(); got != 4 {
		t.Fatalf("applied index after reopen %d, want 4", got)
	}
	// Raft replays the whole log after a restart: nothing may apply twice.
	results := l2.ApplyBatch(logs)
	for i, r := range results {
		if r != nil {
			t.Fatalf("replayed entry %d produced %v; it should be skipped", i+1, r)
		}
	}
	after, _, _ := l2.SKU("a")
	if !reflect.DeepEqual(before, after) {
		t.Fatalf("state changed by replay:\nbefore %+v\nafter  %+v", before, after)
	}
	if after.Total != 105 || after.Sold != 3 || after.Leased["n1"] != 37 {
		t.Fatalf("unexpected row %+v", after)
	}
	checkAudit(t, l2, "a")
}

type bufferSink struct {
	bytes.Buffer
	cancelled bool
}

func (s *bufferSink) ID() string    { return "test" }
func (s *bufferSink) Cancel() error { s.cancelled = true; return nil }
func (s *bufferSink) Close() error  { return nil }

func TestLedger_SnapshotRestoreGivesIdenticalState(t *testing.T) {
	src := newTestLedger(t)
	src.apply(Command{Op: OpCreateSale, SKU: "a", Sale: &SaleConfig{Total: 50, PerUser: 2}})
	src.apply(Command{Op: OpCreateSale, SKU: "b", Sale: &SaleConfig{Total: 7, HoldTTLNanos: 1e9}})
	src.apply(Command{Op: OpLease, Node: "n1", SKU: "a", Qty: 20})
	src.apply(Command{Op: OpLease, Node: "n2", SKU: "b", Qty: 7})
	src.apply(take("n1", "a", "u1", "o1", 2))
	src.apply(take("n2", "b", "u1", "o2", 1))

	snap, err := src.l.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	var sink bufferSink
	if err := snap.Persist(&sink); err != nil {
		t.Fatal(err)
	}
	snap.Release()
	// Changes after the snapshot must not leak into it.
	src.apply(Command{Op: OpRestock, SKU: "a", Qty: 1})

	dst := newTestLedger(t)
	dst.apply(Command{Op: OpCreateSale, SKU: "stale", Sale: &SaleConfig{Total: 1}})
	if err := dst.l.Restore(io.NopCloser(&sink)); err != nil {
		t.Fatal(err)
	}
	if _, _, ok := dst.l.SKU("stale"); ok {
		t.Fatal("restore kept state from before the snapshot")
	}
	for _, sku := range []string{"a", "b"} {
		got, _, _ := dst.l.SKU(sku)
		want, _, _ := src.l.SKU(sku)
		if sku == "a" {
			want.Total--
			want.Available--
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("sku %s after restore:\n got %+v\nwant %+v", sku, got, want)
		}
		checkAudit(t, dst.l, sku)
	}
	if got := dst.l.AppliedIndex(); got != 6 {
		t.Fatalf("applied index after restore %d, want 6", got)
	}
	if id, ok := dst.l.OrderIDForRequest("req-o2"); !ok || id != "o2" {
		t.Fatalf("request index after restore: %q %v", id, ok)
	}
	o, ok, err := dst.l.Order("o2")
	if err != nil || !ok || o.State != OrderHeld || o.ExpiresAtUnixNano == 0 {
		t.Fatalf("order o2 after restore: %+v %v %v", o, ok, err)
	}
}

// TestLedger_RandomCommandsKeepTheLaw drives random command sequences; the
// ledger panics with BUG: on a broken law, and the audit recounts orders.
func TestLedger_RandomCommandsKeepTheLaw(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		tl := newTestLedger(t)
		nodes := []string{"n1", "n2", "n3"}
		skus := []string{"a", "b"}
		var orders []string
		for _, sku := range skus {
			tl.apply(Command{Op: OpCreateSale, SKU: sku, Sale: &SaleConfig{
				Total:        rapid.Int64Range(0, 50).Draw(rt, "total"),
				PerUser:      rapid.Int64Range(0, 3).Draw(rt, "per_user"),
				HoldTTLNanos: rapid.SampledFrom([]int64{0, 100}).Draw(rt, "hold_ttl"),
			}})
		}
		clock := int64(0)
		steps := rapid.IntRange(1, 60).Draw(rt, "steps")
		for i := 0; i < steps; i++ {
			clock += rapid.Int64Range(0, 40).Draw(rt, "tick")
			node := rapid.SampledFrom(nodes).Draw(rt, "node")
			sku := rapid.SampledFrom(skus).Draw(rt, "sku")
			qty := rapid.Int64Range(1, 6).Draw(rt, "qty")
			var c Command
			switch rapid.IntRange(0, 7).Draw(rt, "op") {
			case 0:
				c = Command{Op: OpRestock, SKU: sku, Qty: qty}
			case 1, 2:
				c = Command{Op: OpLease, Node: node, SKU: sku, Qty: qty}
			case 3:
				c = Command{Op: OpReturn, Node: node, SKU: sku, Qty: qty}
			case 4, 5:
				id := fmt.Sprintf("o%d", i)
				orders = append(orders, id)
				user := rapid.SampledFrom([]string{"u1", "u2"}).Draw(rt, "user")
				c = take(node, sku, user, id, rapid.Int64Range(1, 2).Draw(rt, "take_qty"))
			case 6:
				if len(orders) == 0 {
					continue
				}
				c = Command{Op: OpConfirm, OrderID: rapid.SampledFrom(orders).Draw(rt, "order")}
			case 7:
				if len(orders) == 0 {
					continue
				}
				reason := rapid.SampledFrom([]string{ReleaseCancelled, ReleaseExpired}).Draw(rt, "reason")
				c = Command{Op: OpRelease, OrderID: rapid.SampledFrom(orders).Draw(rt, "order"), Reason: reason}
			}
			c.AtUnixNano = clock
			tl.apply(c)
			for _, s := range skus {
				checkAudit(t, tl.l, s)
			}
		}
	})
}

// TestLedger_AuditBetweenCommitAndMirrorUpdate audits in the window where
// bbolt holds a batch the in-memory mirrors do not show yet.
func TestLedger_AuditBetweenCommitAndMirrorUpdate(t *testing.T) {
	tl := newTestLedger(t)
	tl.apply(Command{Op: OpCreateSale, SKU: "a", Sale: &SaleConfig{Total: 10}})
	tl.apply(Command{Op: OpLease, Node: "n1", SKU: "a", Qty: 10})
	audits := 0
	tl.l.testHookAfterCommit = func() {
		audits++
		checkAudit(t, tl.l, "a")
	}
	tl.apply(take("n1", "a", "u1", "o1", 2))
	if audits != 1 {
		t.Fatalf("hook ran %d times", audits)
	}
}
