package raftfsm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"stockd.dev/stockd/raftfsm/command"
	"stockd.dev/stockd/raftfsm/store"
	"stockd.dev/stockd/stock"
	"testing"

	"github.com/hashicorp/raft"
	bolt "go.etcd.io/bbolt"
)

// countKeys counts a bucket's keys, those of a kind and the others, once
// the ledger has written what is pending.
func countKeys(t *testing.T, l *Ledger, bucket []byte, kind func(k []byte) bool) (of, others int) {
	t.Helper()
	if err := l.Flush(); err != nil {
		t.Fatal(err)
	}
	err := l.view(func(tx *bolt.Tx) error {
		return tx.Bucket(bucket).ForEach(func(k, _ []byte) error {
			if kind(k) {
				of++
			} else {
				others++
			}
			return nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	return of, others
}

// requestRecords lists the requests_by_time bucket: groups (8-byte keys)
// and records of the earlier format.
func requestRecords(t *testing.T, l *Ledger) (groups, singles int) {
	t.Helper()
	return countKeys(t, l, store.BucketRequestsByTime, func(k []byte) bool { return len(k) == 8 })
}

// TestRequests_GroupsAndRecordsOfTheEarlierFormat: a Take's request ids
// are one record; those of a file written before groups (a record each)
// still answer repeats after a reopen, and prune and archive as before,
// beside groups.
func TestRequests_GroupsAndRecordsOfTheEarlierFormat(t *testing.T) {
	tl := newTestLedger(t)
	tl.apply(legacyCommand{Op: OpCreateSale, SKU: "a", Sale: &SaleConfig{Total: 100}})
	tl.apply(legacyCommand{Op: OpCreateSale, SKU: "b", Sale: &SaleConfig{Total: 100}})
	tl.apply(legacyCommand{Op: OpLease, Node: "n1", SKU: "a", Qty: 100})
	tl.apply(legacyCommand{Op: OpLease, Node: "n1", SKU: "b", Qty: 100})
	take := func(at int64, from, to int) {
		c := legacyCommand{Op: OpTake, Node: "n1", AtUnixNano: at}
		for i := from; i < to; i++ {
			sku := "a"
			if i%2 == 1 {
				sku = "b"
			}
			c.Takes = append(c.Takes, TakeEntry{SKU: sku, Qty: 1, User: "u", RequestID: fmt.Sprintf("r%02d", i), OrderID: fmt.Sprintf("o%02d", i)})
		}
		for i, r := range tl.apply(c).Takes {
			if r.Outcome != stock.OutcomeOK {
				t.Fatalf("take %s: %s", c.Takes[i].OrderID, r.Outcome)
			}
		}
	}
	take(10, 0, 10)
	take(20, 10, 20)
	if g, s := requestRecords(t, tl.l); g != 2 || s != 0 {
		t.Fatalf("%d groups and %d single records, want 2 and 0", g, s)
	}
	// Rewrite the first group as an earlier version wrote it.
	l := tl.rewriteFile(func(tx *bolt.Tx) error {
		b := tx.Bucket(store.BucketRequestsByTime)
		key := requestGroupKey(10)
		pairs, err := decodeRequestGroup(b.Get(key))
		if err != nil {
			return err
		}
		if err := b.Delete(key); err != nil {
			return err
		}
		for _, p := range pairs {
			if err := b.Put(requestTimeKey(10, p.request), []byte(p.order)); err != nil {
				return err
			}
		}
		return nil
	})
	if n := l.RequestIDs(); n != 20 {
		t.Fatalf("%d request ids after the reopen, want 20", n)
	}
	for i := range 20 {
		if id, ok := l.OrderIDForRequest("u", fmt.Sprintf("r%02d", i)); !ok || id != fmt.Sprintf("o%02d", i) {
			t.Fatalf("request r%02d: %q %v", i, id, ok)
		}
	}
	// Repeats of both kinds get their first orders.
	c := legacyCommand{Op: OpTake, Node: "n1", AtUnixNano: 30, Takes: []TakeEntry{
		{SKU: "a", Qty: 1, User: "u", RequestID: "r04", OrderID: "new1"},
		{SKU: "a", Qty: 1, User: "u", RequestID: "r12", OrderID: "new2"},
	}}
	for i, r := range tl.apply(c).Takes {
		if want := []string{"o04", "o12"}[i]; r.Outcome != stock.OutcomeSame || r.Order.ID != want {
			t.Fatalf("repeat %s: %s %s, want the same order %s", c.Takes[i].RequestID, r.Outcome, r.Order.ID, want)
		}
	}

	// Archiving sale b takes its request ids out of both kinds.
	tl.applyTyped(30, &CloseSale{SKU: "b"})
	if r := tl.applyTyped(30, &ArchiveSale{SKU: "b"}); r.Outcome != stock.OutcomeOK {
		t.Fatalf("archive: %s %s", r.Outcome, r.Detail)
	}
	for steps, after := 0, ""; ; steps++ {
		r := tl.applyTyped(30, &PurgeArchived{SKU: "b", After: after, Scan: 3})
		if r.Outcome != stock.OutcomeOK || steps > 50 {
			t.Fatalf("purge step %d: %s %s", steps, r.Outcome, r.Detail)
		}
		if r.Detail == "done" {
			break
		}
		after = tl.row("b").PurgeAfter
	}
	for i := range 20 {
		_, ok := l.OrderIDForRequest("u", fmt.Sprintf("r%02d", i))
		if ok != (i%2 == 0) {
			t.Fatalf("after archiving b, request r%02d held: %v", i, ok)
		}
	}
	if g, s := requestRecords(t, l); g != 1 || s != 5 {
		t.Fatalf("after the archive: %d groups and %d single records, want 1 and 5", g, s)
	}

	// Keeping the newest three prunes the old records, then cuts the group.
	if r := tl.applyTyped(40, &PruneRequests{BeforeUnixNano: 0, MaxKeep: 3}); r.Outcome != stock.OutcomeOK || r.Qty != 7 {
		t.Fatalf("prune: %s %d, want 7 ids", r.Outcome, r.Qty)
	}
	l = tl.reopen()
	if n := l.RequestIDs(); n != 3 {
		t.Fatalf("%d request ids after pruning, want 3", n)
	}
	for i := range 20 {
		_, ok := l.OrderIDForRequest("u", fmt.Sprintf("r%02d", i))
		if ok != (i == 14 || i == 16 || i == 18) {
			t.Fatalf("after pruning, request r%02d held: %v", i, ok)
		}
	}
	if g, s := requestRecords(t, l); g != 1 || s != 0 {
		t.Fatalf("after pruning: %d groups and %d single records, want 1 and 0", g, s)
	}
	err := l.view(func(tx *bolt.Tx) error {
		v := tx.Bucket(store.BucketRequestsByTime).Get(binary.BigEndian.AppendUint64(nil, 20))
		pairs, err := decodeRequestGroup(v)
		if err == nil && len(pairs) != 3 {
			err = fmt.Errorf("the cut group holds %d ids, want 3", len(pairs))
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, sku := range []string{"a", "b"} {
		checkAudit(t, l, sku)
	}
}

// TestLedger_FormatOfALaterVersionIsRefused: a file records the format it
// was written in; a file, or a snapshot, of a later format than this
// version reads is refused with a clear error instead of misread, and a
// file of the first format (no mark) opens and is marked.
func TestLedger_FormatOfALaterVersionIsRefused(t *testing.T) {
	tl := newTestLedger(t)
	tl.apply(legacyCommand{Op: OpCreateSale, SKU: "a", Sale: &SaleConfig{Total: 5}})
	format := func(l *Ledger) (f uint32) {
		t.Helper()
		if err := l.view(func(tx *bolt.Tx) error {
			var err error
			f, err = store.CheckFormat(tx.Bucket(store.BucketMeta))
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return f
	}
	if f := format(tl.l); f != store.Format {
		t.Fatalf("a new file has format %d, want %d", f, store.Format)
	}
	// A file of the first format carries no mark: it opens, and is marked.
	l := tl.rewriteFile(func(tx *bolt.Tx) error { return tx.Bucket(store.BucketMeta).Delete(store.KeyFormat) })
	if f := format(l); f != store.Format {
		t.Fatalf("a file of format 1 reopened has format %d, want %d", f, store.Format)
	}

	// A snapshot from a later version is refused; the ledger stays as it
	// was. (A snapshot is an image of the file: mark one as a later
	// version's.)
	later := newTestLedger(t)
	later.apply(legacyCommand{Op: OpCreateSale, SKU: "b", Sale: &SaleConfig{Total: 9}})
	image := filepath.Join(t.TempDir(), "snapshot.db")
	if err := os.WriteFile(image, snapshotOf(t, later.l).Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	markLater := func(path string) {
		t.Helper()
		db, err := bolt.Open(path, 0o600, nil)
		if err != nil {
			t.Fatal(err)
		}
		err = db.Update(func(tx *bolt.Tx) error {
			return tx.Bucket(store.BucketMeta).Put(store.KeyFormat, binary.BigEndian.AppendUint32(nil, store.Format+1))
		})
		if cerr := db.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	markLater(image)
	f, err := os.Open(image)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Restore(f); !errors.Is(err, store.ErrFormat) {
		t.Fatalf("restore of a later format's snapshot: %v, want errLedgerFormat", err)
	}
	if _, _, ok := l.SKU("a"); !ok {
		t.Fatal("the refused snapshot replaced the ledger")
	}
	if _, _, ok := l.SKU("b"); ok {
		t.Fatal("the refused snapshot's sale is in the ledger")
	}
	checkAudit(t, l, "a")

	// A file of a later format does not open.
	if err := later.l.Close(); err != nil {
		t.Fatal(err)
	}
	markLater(filepath.Join(later.dir, store.FileName))
	if _, err := OpenLedger(later.dir, nil); !errors.Is(err, store.ErrFormat) {
		t.Fatalf("open of a later format's file: %v, want errLedgerFormat", err)
	}
}

// TestRequests_PruneInTheBatchThatAddsKeepsTheIndexTrue: a prune that
// forgets ids in the very batch (one ApplyBatch) that added them, or that
// forgets an id the batch then sells again, leaves the index holding
// exactly the ids whose records remain: the count a restart rebuilds from
// the records, which the next prune's cut depends on.
func TestRequests_PruneInTheBatchThatAddsKeepsTheIndexTrue(t *testing.T) {
	tl := newTestLedger(t)
	l := tl.l
	tl.applyTyped(1, &SetRules{Rules: RulesScopedRequestIDs})
	tl.apply(legacyCommand{Op: OpCreateSale, SKU: "a", Sale: &SaleConfig{Total: 100}})
	tl.apply(legacyCommand{Op: OpLease, Node: "n1", SKU: "a", Qty: 100})
	entry := func(at int64, c legacyCommand) *raft.Log {
		tl.index++
		c.AtUnixNano = at
		return logOf(t, tl.index, c)
	}
	takeOf := func(user, req, order string) legacyCommand {
		return legacyCommand{Op: OpTake, Node: "n1", Takes: []TakeEntry{{SKU: "a", Qty: 1, User: user, RequestID: req, OrderID: order}}}
	}
	f := func(name string, want int, logs ...*raft.Log) {
		t.Helper()
		for i, r := range l.ApplyBatch(logs) {
			if res, ok := r.(*command.Result); !ok || res.Outcome != stock.OutcomeOK {
				t.Fatalf("%s: entry %d: %+v", name, i, r)
			}
		}
		if n := l.RequestIDs(); n != want {
			t.Fatalf("%s: the index holds %d ids, want %d", name, n, want)
		}
	}
	f("two old ids", 2, entry(10, takeOf("u1", "r1", "o1")), entry(11, takeOf("u2", "r2", "o2")))
	// A batch adds r3, then a prune keeping one id forgets r1, r2 and r3
	// (the oldest first, r3 among them once the cap is one).
	f("added and pruned in one batch", 1,
		entry(20, takeOf("u3", "r3", "o3")),
		entry(21, takeOf("u4", "r4", "o4")),
		entry(22, legacyCommand{Op: OpPruneRequests, MaxKeep: 1}))
	// A batch prunes r4, then sells r4 again to its user (a retry of a
	// forgotten id is a new deduct).
	f("pruned then sold again in one batch", 1,
		entry(30, legacyCommand{Op: OpPruneRequests, BeforeUnixNano: 25}),
		entry(31, takeOf("u4", "r4", "o5")))
	if _, ok := l.OrderIDForRequest("u4", "r4"); !ok {
		t.Fatal("r4, sold again after its prune, is not held")
	}
	held := l.RequestIDs()
	l = tl.reopen()
	if n := l.RequestIDs(); n != held {
		t.Fatalf("a restart rebuilt %d ids from the records, the running index held %d", n, held)
	}
	checkAudit(t, l, "a")
}

// A take whose time is newer than every request group writes its group
// without reading the file for one; a take at a time that has a group
// (the same time again, before and after a reopen, and an older time)
// adds to that group instead of replacing it.
func TestRequests_GroupOfAnOlderTimeIsAddedTo(t *testing.T) {
	tl := newTestLedger(t)
	tl.apply(legacyCommand{Op: OpCreateSale, SKU: "a", Sale: &SaleConfig{Total: 100}})
	tl.apply(legacyCommand{Op: OpLease, Node: "n1", SKU: "a", Qty: 100})
	n := 0
	take := func(at int64) {
		t.Helper()
		c := legacyCommand{Op: OpTake, Node: "n1", AtUnixNano: at}
		for range 3 {
			c.Takes = append(c.Takes, TakeEntry{SKU: "a", Qty: 1, User: "u", RequestID: fmt.Sprintf("r%02d", n), OrderID: fmt.Sprintf("o%02d", n)})
			n++
		}
		for i, r := range tl.apply(c).Takes {
			if r.Outcome != stock.OutcomeOK {
				t.Fatalf("take %s: %s", c.Takes[i].OrderID, r.Outcome)
			}
		}
	}
	held := func(l *Ledger, when string) {
		t.Helper()
		for i := range n {
			if _, ok := l.OrderIDForRequest("u", fmt.Sprintf("r%02d", i)); !ok {
				t.Fatalf("%s: request r%02d is not held", when, i)
			}
		}
		if got := l.RequestIDs(); got != n {
			t.Fatalf("%s: %d request ids, want %d", when, got, n)
		}
	}
	take(20)
	take(20)
	take(10)
	held(tl.l, "before the reopen")
	if err := tl.l.Flush(); err != nil {
		t.Fatal(err)
	}
	l := tl.reopen()
	if l.requestGroupsAtMax != 20 {
		t.Fatalf("newest group at %d after the reopen, want 20", l.requestGroupsAtMax)
	}
	take(20)
	take(10)
	take(30)
	held(tl.reopen(), "after the reopen")
	if g, _ := requestRecords(t, tl.l); g != 3 {
		t.Fatalf("%d groups, want 3 (times 10, 20 and 30)", g)
	}
	checkAudit(t, tl.l, "a")
}
