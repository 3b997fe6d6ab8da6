package raftfsm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"reflect"
	"slices"
	"stockd.dev/stockd/raftfsm/command"
	"stockd.dev/stockd/raftfsm/orderfeed"
	"stockd.dev/stockd/raftfsm/store"
	"stockd.dev/stockd/stock"
	"testing"

	"github.com/hashicorp/raft"
	bolt "go.etcd.io/bbolt"
)

// reopen closes the ledger and opens its file again, as a restart does;
// the test ledger goes on with the new one.
func (t *testLedger) reopen() *Ledger {
	t.tb.Helper()
	if err := t.l.Close(); err != nil {
		t.tb.Fatal(err)
	}
	l, err := OpenLedger(t.dir, nil)
	if err != nil {
		t.tb.Fatal(err)
	}
	t.tb.Cleanup(func() { l.Close() })
	t.l = l
	return l
}

// rewriteFile changes the ledger's file, closed, with fn (to make a file
// as an earlier version wrote it), then opens it again.
func (t *testLedger) rewriteFile(fn func(tx *bolt.Tx) error) *Ledger {
	t.tb.Helper()
	if err := t.l.Close(); err != nil {
		t.tb.Fatal(err)
	}
	db, err := bolt.Open(filepath.Join(t.dir, store.FileName), 0o600, nil)
	if err != nil {
		t.tb.Fatal(err)
	}
	err = db.Update(fn)
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.tb.Fatal(err)
	}
	return t.reopen()
}

// applyTyped applies a typed command at the next log index.
func (t *testLedger) applyTyped(at int64, c Command) *command.Result {
	t.tb.Helper()
	t.index++
	res, _ := t.l.Apply(&raft.Log{Index: t.index, Term: 1, Type: raft.LogCommand, Data: EncodeCommand(nil, at, c)}).(*command.Result)
	if res == nil {
		t.tb.Fatalf("apply %s at %d: no result", c.Op(), t.index)
	}
	return res
}

// feedTally replays the order feed into per-SKU held and sold units, the
// way a consumer would, and checks the feed's own order as it goes.
type feedTally struct {
	last   Cursor
	orders map[string]stock.Order
	held   map[string]int64
	sold   map[string]int64
	events []stock.FeedEvent
}

type fataler interface {
	Helper()
	Fatalf(string, ...any)
}

func (f *feedTally) add(t fataler, e stock.FeedEvent) {
	t.Helper()
	if f.orders == nil {
		f.orders, f.held, f.sold = map[string]stock.Order{}, map[string]int64{}, map[string]int64{}
	}
	if e.Seq != f.last.Seq+1 || e.Index < f.last.Index {
		t.Fatalf("event %s follows %s: not the next in log order", e.Cursor(), f.last)
	}
	f.last = e.Cursor()
	f.events = append(f.events, e)
	o, prior := f.orders[e.Order.ID]
	switch e.Type {
	case stock.FeedOrderCreated:
		if prior {
			t.Fatalf("order %s created twice (event %s)", e.Order.ID, e.Cursor())
		}
		switch e.Order.State {
		case stock.OrderHeld:
			f.held[e.Order.SKU] += e.Order.Qty
		case stock.OrderSold:
			f.sold[e.Order.SKU] += e.Order.Qty
		default:
			t.Fatalf("order %s created %s", e.Order.ID, e.Order.State)
		}
	case stock.FeedOrderConfirmed:
		if !prior || o.State != stock.OrderHeld || e.Order.State != stock.OrderSold {
			t.Fatalf("confirm of order %s in state %q (known %v) to %s", e.Order.ID, o.State, prior, e.Order.State)
		}
		f.held[o.SKU] -= o.Qty
		f.sold[o.SKU] += o.Qty
	case stock.FeedOrderReleased:
		if !prior {
			break // a take turned down: no order
		}
		if o.State != stock.OrderHeld || e.Order.State != stock.OrderReleased || e.Order.ReleaseReason == "" {
			t.Fatalf("release of order %s in state %s to %s (%q)", e.Order.ID, o.State, e.Order.State, e.Order.ReleaseReason)
		}
		f.held[o.SKU] -= o.Qty
	default:
		t.Fatalf("event %s of type %d", e.Cursor(), e.Type)
	}
	if e.Type != stock.FeedOrderReleased || prior {
		f.orders[e.Order.ID] = e.Order
	}
}

func (f *feedTally) readAll(t fataler, l *Ledger) {
	t.Helper()
	for {
		page, err := l.ReadFeed(f.last, 7)
		if err != nil {
			t.Fatalf("read feed after %s: %v", f.last, err)
		}
		if len(page.Events) == 0 {
			return
		}
		for _, e := range page.Events {
			f.add(t, e)
		}
	}
}

func TestFeed_OrderEventsSurviveReopenCrashAndRestore(t *testing.T) {
	tl := newTestLedger(t)
	tl.apply(legacyCommand{Op: OpCreateSale, SKU: "h", Sale: &SaleConfig{Total: 10, HoldTTLNanos: 100}})
	tl.apply(legacyCommand{Op: OpCreateSale, SKU: "p", Sale: &SaleConfig{Total: 10, PerUser: 1}})
	tl.apply(legacyCommand{Op: OpLease, Node: "n1", SKU: "h", Qty: 10})
	tl.apply(legacyCommand{Op: OpLease, Node: "n1", SKU: "p", Qty: 10})
	tl.apply(legacyCommand{Op: OpTake, Node: "n1", AtUnixNano: 10, Takes: []TakeEntry{
		{SKU: "h", Qty: 1, User: "u1", OrderID: "o1"}, {SKU: "h", Qty: 2, User: "u2", OrderID: "o2"},
		{SKU: "h", Qty: 1, User: "u3", OrderID: "o3"}, {SKU: "p", Qty: 1, User: "u1", OrderID: "o4"},
		{SKU: "p", Qty: 1, User: "u1", OrderID: "o5"}, // over the per-user limit: turned down
	}})
	tl.apply(legacyCommand{Op: OpConfirm, OrderID: "o1", AtUnixNano: 20})
	tl.apply(legacyCommand{Op: OpRelease, OrderID: "o2", Reason: stock.ReleaseCancelled, AtUnixNano: 30})
	tl.apply(legacyCommand{Op: OpExpire, OrderIDs: []string{"o3"}, AtUnixNano: 200})
	tl.apply(legacyCommand{Op: OpTake, Node: "n1", Takes: []TakeEntry{{SKU: "p", Qty: 1, User: "u1", OrderID: "o4"}}}) // re-proposed: no event

	var got feedTally
	got.readAll(t, tl.l)
	type ev struct {
		typ   stock.FeedEventType
		order string
		state stock.OrderState
	}
	want := []ev{{stock.FeedOrderCreated, "o1", stock.OrderHeld}, {stock.FeedOrderCreated, "o2", stock.OrderHeld}, {stock.FeedOrderCreated, "o3", stock.OrderHeld},
		{stock.FeedOrderCreated, "o4", stock.OrderSold}, {stock.FeedOrderReleased, "o5", stock.OrderReleased},
		{stock.FeedOrderConfirmed, "o1", stock.OrderSold}, {stock.FeedOrderReleased, "o2", stock.OrderReleased}, {stock.FeedOrderReleased, "o3", stock.OrderReleased}}
	if len(got.events) != len(want) {
		t.Fatalf("%d events, want %d: %+v", len(got.events), len(want), got.events)
	}
	for i, w := range want {
		e := got.events[i]
		if e.Type != w.typ || e.Order.ID != w.order || e.Order.State != w.state {
			t.Fatalf("event %d: %s %s %s, want %s %s %s", i, e.Type, e.Order.ID, e.Order.State, w.typ, w.order, w.state)
		}
	}
	if r := got.events[4].Order.ReleaseReason; r != stock.ReleaseTurnedDownUserLimit {
		t.Fatalf("turned-down take released with reason %q", r)
	}
	if r := got.events[7].Order.ReleaseReason; r != stock.ReleaseExpired {
		t.Fatalf("expired hold released with reason %q", r)
	}
	for _, sku := range []string{"h", "p"} {
		row := tl.row(sku)
		if got.held[sku] != row.Held || got.sold[sku] != row.Sold {
			t.Fatalf("feed tally of %s: held %d sold %d; row %+v", sku, got.held[sku], got.sold[sku], row)
		}
	}

	// A clean reopen reads the same events from the file.
	if err := tl.l.Close(); err != nil {
		t.Fatal(err)
	}
	l2, err := OpenLedger(tl.dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	var again feedTally
	again.readAll(t, l2)
	if !reflect.DeepEqual(again.events, got.events) {
		t.Fatalf("events after reopen differ:\n got %+v\nwant %+v", again.events, got.events)
	}

	// A crash after applying, before the ledger's write: raft replays the
	// entries and the feed numbers their events as it did the first time.
	l2.bh.Halt()
	l2.test.noFinalWrite = true
	tl.l = l2
	tl.apply(legacyCommand{Op: OpTake, Node: "n1", Takes: []TakeEntry{{SKU: "h", Qty: 1, User: "u9", OrderID: "o9"}}})
	crashed := tl.index
	var before feedTally
	before.readAll(t, l2)
	entry := logOf(t, crashed, legacyCommand{Op: OpTake, Node: "n1", Takes: []TakeEntry{{SKU: "h", Qty: 1, User: "u9", OrderID: "o9"}}})
	if err := l2.Close(); err != nil {
		t.Fatal(err)
	}
	l3, err := OpenLedger(tl.dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l3.Close()
	if l3.AppliedIndex() >= crashed {
		t.Fatalf("the crash kept index %d", l3.AppliedIndex())
	}
	l3.ApplyBatch([]*raft.Log{entry})
	var replayed feedTally
	replayed.readAll(t, l3)
	if !reflect.DeepEqual(replayed.events, before.events) {
		t.Fatalf("events after crash and replay differ:\n got %+v\nwant %+v", replayed.events, before.events)
	}

	// A snapshot carries the feed; the restored node reads the same.
	sink := snapshotOf(t, l3)
	dst := newTestLedger(t)
	if err := dst.l.Restore(io.NopCloser(sink)); err != nil {
		t.Fatal(err)
	}
	var restored feedTally
	restored.readAll(t, dst.l)
	if !reflect.DeepEqual(restored.events, before.events) {
		t.Fatalf("events after restore differ")
	}
	for _, sku := range []string{"h", "p"} {
		checkAudit(t, dst.l, sku)
	}
}

// ledgerOfTakes is a ledger with one sale, "a", and n takes of it by n1:
// the feed holds their n events.
func ledgerOfTakes(t *testing.T, n int) (*testLedger, feedTally) {
	t.Helper()
	tl := newTestLedger(t)
	tl.apply(legacyCommand{Op: OpCreateSale, SKU: "a", Sale: &SaleConfig{Total: 100}})
	tl.apply(legacyCommand{Op: OpLease, Node: "n1", SKU: "a", Qty: 100})
	for i := range n {
		tl.apply(take("n1", "a", "u", "o"+string(rune('a'+i)), 1))
	}
	var all feedTally
	all.readAll(t, tl.l)
	return tl, all
}

func TestFeed_CursorsAndPruning(t *testing.T) {
	tl, all := ledgerOfTakes(t, 20)
	if len(all.events) != 20 {
		t.Fatalf("%d events, want 20", len(all.events))
	}
	c5 := all.events[4].Cursor()

	// A consumer acknowledges event 5; a cursor the feed never had is refused.
	if r := tl.applyTyped(0, &AckConsumer{Name: "shop", Cursor: c5}); r.Outcome != stock.OutcomeOK {
		t.Fatalf("ack: %s %s", r.Outcome, r.Detail)
	}
	bogus := Cursor{Index: c5.Index + 1, Seq: c5.Seq}
	if r := tl.applyTyped(0, &AckConsumer{Name: "shop", Cursor: bogus}); r.Outcome != stock.OutcomeInvalid {
		t.Fatalf("ack of a bogus cursor: %s", r.Outcome)
	}
	if _, err := tl.l.ReadFeed(bogus, 10); !errors.Is(err, ErrBadCursor) {
		t.Fatalf("read after a bogus cursor: %v", err)
	}
	st, err := tl.l.FeedStats()
	if err != nil || len(st.Consumers) != 1 || st.Consumers[0].Cursor != c5 || st.Head != all.events[19].Cursor() {
		t.Fatalf("stats %+v %v", st, err)
	}

	// Pruning through event 8: cursors before it are expired, after it fine.
	c8 := all.events[7].Cursor()
	if r := tl.applyTyped(0, &PruneEvents{Through: c8}); r.Outcome != stock.OutcomeOK || r.Qty != 8 {
		t.Fatalf("prune: %s %d %s", r.Outcome, r.Qty, r.Detail)
	}
	if _, err := tl.l.ReadFeed(c5, 10); !errors.Is(err, stock.ErrCursorExpired) {
		t.Fatalf("read after a pruned cursor: %v, want ErrCursorExpired", err)
	}
	if r := tl.applyTyped(0, &AckConsumer{Name: "shop", Cursor: c5}); r.Outcome != stock.OutcomeExpired {
		t.Fatalf("ack of a pruned cursor: %s", r.Outcome)
	}
	page, err := tl.l.ReadFeed(c8, 100)
	if err != nil || len(page.Events) != 12 || page.Events[0].Seq != 9 {
		t.Fatalf("read after the floor: %d events %v", len(page.Events), err)
	}
	page, err = tl.l.ReadFeed(Cursor{}, 3)
	if err != nil || len(page.Events) != 3 || page.Events[0].Seq != 9 {
		t.Fatalf("read from the start after pruning: %+v %v", page.Events, err)
	}
	// A cursor beyond this ledger's log: the node is behind, not the cursor bad.
	page, err = tl.l.ReadFeed(Cursor{Index: tl.index + 5, Seq: 99}, 10)
	if err != nil || !page.Behind {
		t.Fatalf("cursor ahead of the log: behind %v err %v", page.Behind, err)
	}

	// The persister deletes pruned events from the file; a reopen keeps the floor.
	if err := tl.l.Flush(); err != nil {
		t.Fatal(err)
	}
	l2 := tl.reopen()
	if _, ok, _ := l2.FeedEvent(8); ok {
		t.Fatal("a pruned event is still in the file")
	}
	if _, err := l2.ReadFeed(c5, 10); !errors.Is(err, stock.ErrCursorExpired) {
		t.Fatalf("after reopen, read after a pruned cursor: %v", err)
	}
	st, _ = l2.FeedStats()
	if st.Floor != c8 || st.Retained != 12 || len(st.Consumers) != 1 {
		t.Fatalf("stats after reopen %+v", st)
	}
	if a := checkAudit(t, l2, "a"); a.Row.Sold != 20 {
		t.Fatalf("sold %d, want 20", a.Row.Sold)
	}
}

func TestFeed_ManyEventsReadFromFileAndMemory(t *testing.T) {
	tl := newTestLedger(t)
	const n = 3*orderfeed.MemoryEvents + 777
	tl.apply(legacyCommand{Op: OpCreateSale, SKU: "a", Sale: &SaleConfig{Total: n}})
	tl.apply(legacyCommand{Op: OpLease, Node: "n1", SKU: "a", Qty: n})
	for i := 0; i < n; {
		c := legacyCommand{Op: OpTake, Node: "n1"}
		for j := 0; j < 1000 && i < n; j, i = j+1, i+1 {
			c.Takes = append(c.Takes, TakeEntry{SKU: "a", Qty: 1, User: "u", OrderID: fmt.Sprintf("o%06d", i)})
		}
		tl.apply(c)
		if i%5000 < 1000 {
			if err := tl.l.Flush(); err != nil {
				t.Fatal(err)
			}
		}
	}
	first, held := tl.l.feed.InMemory()
	// The events not yet written (up to 5,000 here), the last
	// feedMemoryEvents written, and whole chunks (a take's 1,000 events
	// each) around them.
	if first <= 1 || held > 5000+orderfeed.MemoryEvents+2*1000 {
		t.Fatalf("memory holds %d events from %d: not trimmed", held, first)
	}
	var all feedTally
	all.readAll(t, tl.l) // from the file, then from memory
	if len(all.events) != n || all.sold["a"] != n {
		t.Fatalf("read %d events selling %d, want %d", len(all.events), all.sold["a"], n)
	}
	for i, e := range all.events {
		if want := fmt.Sprintf("o%06d", i); e.Order.ID != want {
			t.Fatalf("event %d is order %s, want %s", i+1, e.Order.ID, want)
		}
	}
	if a := checkAudit(t, tl.l, "a"); a.Orders != n {
		t.Fatalf("%d order records, want %d", a.Orders, n)
	}
}

// TestFeed_ChunksAndEventsOfTheEarlierFormat: the file keeps events in
// chunks of up to feedDiskChunkEvents; a file of an earlier version, one
// value an event, still reads, takes new chunks after its events, and
// prunes both kinds.
func TestFeed_ChunksAndEventsOfTheEarlierFormat(t *testing.T) {
	tl := newTestLedger(t)
	const n = 2*orderfeed.DiskChunkEvents + 50
	tl.apply(legacyCommand{Op: OpCreateSale, SKU: "a", Sale: &SaleConfig{Total: 2 * n}})
	tl.apply(legacyCommand{Op: OpLease, Node: "n1", SKU: "a", Qty: 2 * n})
	take := func(from, to int) {
		c := legacyCommand{Op: OpTake, Node: "n1"}
		for i := from; i < to; i++ {
			c.Takes = append(c.Takes, TakeEntry{SKU: "a", Qty: 1, User: "u", OrderID: fmt.Sprintf("o%06d", i)})
		}
		tl.apply(c)
		if err := tl.l.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	take(0, n)

	// The file holds the n events in three chunks; rewrite them as an
	// earlier version wrote them.
	l := tl.rewriteFile(func(tx *bolt.Tx) error {
		b := tx.Bucket(store.BucketEvents)
		var keys, olds [][]byte
		err := b.ForEach(func(k, v []byte) error {
			keys = append(keys, slices.Clone(k))
			return orderfeed.EachFeedEvent(binary.BigEndian.Uint64(k), v, 0, 1<<62, func(e *stock.FeedEvent) bool {
				olds = append(olds, binary.BigEndian.AppendUint64(nil, e.Seq), orderfeed.EncodeFeedEvent(nil, e))
				return true
			})
		})
		if err != nil {
			return err
		}
		if len(keys) != 3 || len(olds) != 2*n {
			return fmt.Errorf("%d chunks holding %d events, want 3 and %d", len(keys), len(olds)/2, n)
		}
		for _, k := range keys {
			if err := b.Delete(k); err != nil {
				return err
			}
		}
		for i := 0; i < len(olds); i += 2 {
			if err := b.Put(olds[i], olds[i+1]); err != nil {
				return err
			}
		}
		return nil
	})
	take(n, 2*n) // new chunks after the old events
	var all feedTally
	all.readAll(t, l)
	if len(all.events) != 2*n {
		t.Fatalf("read %d events, want %d", len(all.events), 2*n)
	}
	for i, e := range all.events {
		if want := fmt.Sprintf("o%06d", i); e.Order.ID != want || e.Seq != uint64(i+1) {
			t.Fatalf("event %d is order %s seq %d, want %s", i+1, e.Order.ID, e.Seq, want)
		}
		if got, ok, err := l.FeedEvent(e.Seq); err != nil || !ok || got.Order.ID != e.Order.ID {
			t.Fatalf("event %d read alone: %v %v %+v", e.Seq, ok, err, got)
		}
	}

	// Prune into the middle of the new chunks: what is left reads on.
	through := all.events[n+orderfeed.DiskChunkEvents/2].Cursor()
	if r := tl.applyTyped(0, &PruneEvents{Through: through}); r.Outcome != stock.OutcomeOK {
		t.Fatalf("prune: %s %s", r.Outcome, r.Detail)
	}
	if err := tl.l.Flush(); err != nil {
		t.Fatal(err)
	}
	l = tl.reopen()
	for _, seq := range []uint64{1, uint64(n), through.Seq} {
		if _, ok, _ := l.FeedEvent(seq); ok {
			t.Fatalf("pruned event %d still reads", seq)
		}
	}
	rest := feedTally{last: through}
	rest.readAll(t, l)
	if len(rest.events) != 2*n-int(through.Seq) || rest.events[0].Seq != through.Seq+1 {
		t.Fatalf("after pruning through %d: %d events from %d", through.Seq, len(rest.events), rest.events[0].Seq)
	}
	if a := checkAudit(t, l, "a"); a.Orders != 2*n {
		t.Fatalf("%d order records, want %d", a.Orders, 2*n)
	}
	err := l.view(func(tx *bolt.Tx) error {
		k, _ := tx.Bucket(store.BucketEvents).Cursor().First()
		if first := binary.BigEndian.Uint64(k); first > through.Seq || first+orderfeed.DiskChunkEvents <= through.Seq {
			return fmt.Errorf("the file's first chunk starts at %d: the pruned ones should be gone up to the one holding %d", first, through.Seq)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestFeed_ForwardAcksMoveOnlyForward: a forward-only acknowledgement (a
// service's) needs rules 5, never creates a consumer, moves a registered
// one ahead and leaves it where it is when given an older cursor.
func TestFeed_ForwardAcksMoveOnlyForward(t *testing.T) {
	tl, all := ledgerOfTakes(t, 10)
	c3, c7 := all.events[2].Cursor(), all.events[6].Cursor()
	if r := tl.applyTyped(0, &AckConsumer{Name: "sink", Cursor: c3, Forward: true}); r.Outcome != stock.OutcomeInvalid {
		t.Fatalf("a forward ack before rules 5: %s", r.Outcome)
	}
	tl.applyTyped(0, &SetRules{Rules: RulesForwardAcks})
	if r := tl.applyTyped(0, &AckConsumer{Name: "sink", Cursor: c3, Forward: true}); r.Outcome != stock.OutcomeNotFound {
		t.Fatalf("a forward ack of an unknown consumer: %s, want not found", r.Outcome)
	}
	tl.applyTyped(0, &AckConsumer{Name: "sink", Cursor: c3})
	cursorIs := func(want Cursor) {
		t.Helper()
		st, err := tl.l.FeedStats()
		if err != nil || len(st.Consumers) != 1 || st.Consumers[0].Cursor != want {
			t.Fatalf("consumers %+v %v, want the cursor at %s", st.Consumers, err, want)
		}
	}
	if r := tl.applyTyped(0, &AckConsumer{Name: "sink", Cursor: c7, Forward: true}); r.Outcome != stock.OutcomeOK {
		t.Fatalf("forward to event 7: %s %s", r.Outcome, r.Detail)
	}
	cursorIs(c7)
	for _, c := range []Cursor{c3, c7} {
		if r := tl.applyTyped(0, &AckConsumer{Name: "sink", Cursor: c, Forward: true}); r.Outcome != stock.OutcomeSame {
			t.Fatalf("forward back to %s: %s, want same", c, r.Outcome)
		}
	}
	cursorIs(c7)
	tl.applyTyped(0, &AckConsumer{Name: "sink", Cursor: c3}) // the admin's may move it back
	cursorIs(c3)
}
