package raftfsm

import (
	"fmt"
	"slices"
	"stockd.dev/stockd/raftfsm/store"
	"stockd.dev/stockd/stock"
	"strconv"
	"testing"

	bolt "go.etcd.io/bbolt"
)

// orderKeys counts the orders bucket's blocks and order records.
func orderKeys(t *testing.T, l *Ledger) (blocks, records int) {
	t.Helper()
	return countKeys(t, l, store.BucketOrders, store.IsOrderBlockKey)
}

// saleOrderIDs streams sku's orders after after and checks that they come
// in strictly rising id order, each as Order reads it.
func saleOrderIDs(t fataler, l *Ledger, sku, after string) []string {
	t.Helper()
	var ids []string
	_, err := l.SaleOrders(sku, "", after, func(o *stock.Order) error {
		if len(ids) > 0 && o.ID <= ids[len(ids)-1] {
			return fmt.Errorf("order %s streamed after %s", o.ID, ids[len(ids)-1])
		}
		if o.ID <= after || o.SKU != sku {
			return fmt.Errorf("order %s of %s streamed for %s after %q", o.ID, o.SKU, sku, after)
		}
		if got, ok, err := l.Order(o.ID); err != nil || !ok || got != *o {
			return fmt.Errorf("order %s streams as %+v, reads as %+v (%v %v)", o.ID, *o, got, ok, err)
		}
		ids = append(ids, o.ID)
		return nil
	})
	if err != nil {
		t.Fatalf("stream %s after %q: %v", sku, after, err)
	}
	return ids
}

// TestOrders_BlocksAndRecordsOfTheEarlierFormat: the orders a take sells
// with ids of the engine's shape share a record per 256 sequences of a
// node; held orders and ids of other shapes keep records of their own, as
// do the sold orders of a file written before blocks. Both kinds answer
// reads, re-proposals and repeated request ids after a reopen, stream in
// id order, count in the audit, and leave with an archive.
func TestOrders_BlocksAndRecordsOfTheEarlierFormat(t *testing.T) {
	tl := newTestLedger(t)
	tl.apply(legacyCommand{Op: OpCreateSale, SKU: "a", Sale: &SaleConfig{Total: 1000}})
	tl.apply(legacyCommand{Op: OpCreateSale, SKU: "b", Sale: &SaleConfig{Total: 1000}})
	tl.apply(legacyCommand{Op: OpCreateSale, SKU: "h", Sale: &SaleConfig{Total: 10, HoldTTLNanos: 1 << 40}})
	for _, n := range []string{"n1", "n2"} {
		for _, sku := range []string{"a", "b"} {
			tl.apply(legacyCommand{Op: OpLease, Node: n, SKU: sku, Qty: 500})
		}
	}
	tl.apply(legacyCommand{Op: OpLease, Node: "n1", SKU: "h", Qty: 10})
	want := map[string]TakeEntry{} // order id -> its take
	var takes []TakeEntry
	add := func(node, sku, id string) {
		e := TakeEntry{SKU: sku, Qty: 1, User: "u" + strconv.Itoa(len(takes)%7), RequestID: "r-" + id, OrderID: id}
		want[id] = e
		takes = append(takes, e)
	}
	// n1: sequences 1 to 600 (blocks 0, 1 and 2), a and b in turn; n2: 40.
	for seq := uint64(1); seq <= 600; seq++ {
		add("n1", []string{"a", "b"}[seq%2], "n1-"+strconv.FormatUint(seq, 36)+"-x"+strconv.FormatUint(seq*7919, 36))
	}
	for seq := uint64(1); seq <= 40; seq++ {
		add("n2", "a", "n2-"+strconv.FormatUint(seq, 36)+"-y")
	}
	at := int64(0)
	// take applies a take whose entries must all have outcome; one that
	// wins or repeats must answer the order of the entry's request id.
	take := func(node string, entries []TakeEntry, outcome stock.Outcome) {
		t.Helper()
		at += 10
		res := tl.apply(legacyCommand{Op: OpTake, Node: node, Takes: entries, AtUnixNano: at})
		for i, r := range res.Takes {
			if r.Outcome != outcome {
				t.Fatalf("take %s: %s, want %s", entries[i].OrderID, r.Outcome, outcome)
			}
			if e := entries[i]; outcome != stock.OutcomeClosed && (r.Order.RequestID != e.RequestID || r.Order.SKU != e.SKU || r.Order.User != e.User) {
				t.Fatalf("take %s answers order %+v", e.OrderID, r.Order)
			}
		}
	}
	for i := 0; i < 600; i += 100 { // takes of 100 units cross blocks
		take("n1", takes[i:i+100], stock.OutcomeOK)
	}
	take("n2", takes[600:], stock.OutcomeOK)
	// Records of their own: a held order, a sequence not in canonical
	// base 36, an id of another shape.
	held := TakeEntry{SKU: "h", Qty: 1, User: "u1", RequestID: "r-held", OrderID: "n1-" + strconv.FormatUint(601, 36) + "-h"}
	odd := TakeEntry{SKU: "a", Qty: 1, User: "u2", RequestID: "r-odd", OrderID: "n1-0" + strconv.FormatUint(602, 36) + "-z"}
	other := TakeEntry{SKU: "a", Qty: 1, User: "u3", RequestID: "r-other", OrderID: "o-1"}
	take("n1", []TakeEntry{held, odd, other}, stock.OutcomeOK)
	for _, e := range []TakeEntry{held, odd, other} {
		want[e.OrderID] = e
	}
	if b, r := orderKeys(t, tl.l); b != 4 || r != 3 {
		t.Fatalf("%d blocks and %d order records, want 4 and 3", b, r)
	}
	// Ids that share a sequence (a node may name its orders so): the
	// first has the slot in its block, the others records of their own,
	// so a block never holds more than 256.
	var shared []TakeEntry
	for i := 0; i < 5; i++ {
		e := TakeEntry{SKU: "b", Qty: 1, User: "u5", RequestID: fmt.Sprintf("r-shared-%d", i), OrderID: "n2-big-" + strconv.Itoa(i)}
		shared = append(shared, e)
		want[e.OrderID] = e
	}
	take("n2", shared, stock.OutcomeOK)
	if b, r := orderKeys(t, tl.l); b != 5 || r != 7 {
		t.Fatalf("after ids sharing a sequence: %d blocks and %d order records, want 5 and 7", b, r)
	}
	// A take of an id the ledger cannot tell from a block's key is turned
	// down.
	res := tl.apply(legacyCommand{Op: OpTake, Node: "n1", AtUnixNano: at, Takes: []TakeEntry{{SKU: "a", Qty: 1, User: "u", OrderID: "\x00n1"}}})
	if res.Takes[0].Outcome != stock.OutcomeInvalid {
		t.Fatalf("a take of an id starting with 0x00: %s", res.Takes[0].Outcome)
	}

	// Rewrite block 0 of n1 as an earlier version wrote its orders: a
	// record each.
	tl.rewriteFile(func(tx *bolt.Tx) error {
		bucket := tx.Bucket(store.BucketOrders)
		key := []byte(store.OrderBlockKey("n1", 0))
		b, err := store.ParseOrderBlock(key, bucket.Get(key))
		if err != nil {
			return err
		}
		type record struct{ id, v []byte }
		var records []record
		err = b.Each(func(_ int, m *store.BlockMember) bool {
			records = append(records, record{b.AppendID(nil, m), slices.Clone(m.Record)})
			return true
		})
		if err != nil {
			return err
		}
		if err := bucket.Delete(key); err != nil {
			return err
		}
		for _, r := range records {
			if err := bucket.Put(r.id, r.v); err != nil {
				return err
			}
		}
		return nil
	})
	if b, r := orderKeys(t, tl.l); b != 4 || r != 7+255 {
		t.Fatalf("after the rewrite: %d blocks and %d order records, want 4 and 262", b, r)
	}

	// Every order reads as taken; a re-proposal of its id, or its request
	// id under a new order id, answers it.
	for id, e := range want {
		o, ok, err := tl.l.Order(id)
		if err != nil || !ok || o.SKU != e.SKU || o.User != e.User || o.RequestID != e.RequestID {
			t.Fatalf("order %s reads %+v %v %v", id, o, ok, err)
		}
	}
	var again []TakeEntry
	for _, e := range []TakeEntry{takes[0], takes[254], takes[255], takes[599], takes[600], held, odd, other} {
		again = append(again, e)
		r := e
		r.OrderID = "n1-" + strconv.FormatUint(10000+uint64(len(again)), 36) + "-new"
		again = append(again, r)
	}
	take("n1", again, stock.OutcomeSame)
	if _, r := orderKeys(t, tl.l); r != 262 {
		t.Fatalf("re-proposals wrote order records: %d", r)
	}

	// The stream: all of a sale's orders in id order, from the start or
	// after any of them, wherever each is stored.
	var wantA []string
	for id, e := range want {
		if e.SKU == "a" {
			wantA = append(wantA, id)
		}
	}
	slices.Sort(wantA)
	if got := saleOrderIDs(t, tl.l, "a", ""); !slices.Equal(got, wantA) {
		t.Fatalf("sale a streams %d orders, want %d:\n%v\n%v", len(got), len(wantA), got, wantA)
	}
	for _, i := range []int{0, 1, 17, len(wantA) / 2, len(wantA) - 2, len(wantA) - 1} {
		if got := saleOrderIDs(t, tl.l, "a", wantA[i]); !slices.Equal(got, wantA[i+1:]) {
			t.Fatalf("sale a after %s streams %d orders, want %d", wantA[i], len(got), len(wantA)-i-1)
		}
	}
	for _, sku := range []string{"a", "b", "h"} {
		checkAudit(t, tl.l, sku)
	}

	// Archive a: its orders leave the blocks, b's stay in them.
	archive := func(sku string) {
		t.Helper()
		at += 10
		tl.applyTyped(at, &CloseSale{SKU: sku})
		if r := tl.applyTyped(at, &ArchiveSale{SKU: sku}); r.Outcome != stock.OutcomeOK {
			t.Fatalf("archive %s: %s", sku, r.Outcome)
		}
		for step := 0; ; step++ {
			row, _, _ := tl.l.SKU(sku)
			if row.PurgeDone {
				break
			}
			if step > 100 {
				t.Fatalf("the purge of %s does not end", sku)
			}
			tl.applyTyped(at, &PurgeArchived{SKU: sku, After: row.PurgeAfter, Scan: 50})
			// The purge's cursor, a block's key among them, is kept in
			// the sale's row in the file: it must read back as written.
			if step%2 == 0 {
				cursor := tl.row(sku).PurgeAfter
				tl.reopen()
				if got := tl.row(sku).PurgeAfter; got != cursor {
					t.Fatalf("the purge's cursor %q reads back as %q", cursor, got)
				}
			}
		}
		row, _, _ := tl.l.SKU(sku)
		if row.ArchivedSold != row.Sold || row.ArchivedOrders != int64(len(saleOrderIDsOf(want, sku))) {
			t.Fatalf("archived %s: %d of %d units, %d orders", sku, row.ArchivedSold, row.Sold, row.ArchivedOrders)
		}
		for id, e := range want {
			_, ok, err := tl.l.Order(id)
			if err != nil || ok != (e.SKU != sku) {
				t.Fatalf("after archiving %s, order %s of %s reads %v %v", sku, id, e.SKU, ok, err)
			}
		}
		for _, id := range saleOrderIDsOf(want, sku) {
			delete(want, id)
		}
	}
	archive("a")
	if b, r := orderKeys(t, tl.l); b != 3 || r != 133 {
		t.Fatalf("after archiving a: %d blocks and %d order records, want 3 and 133 (b's of the rewritten block and of the shared sequence, the held one)", b, r)
	}
	if got := saleOrderIDs(t, tl.l, "b", ""); len(got) != 305 {
		t.Fatalf("sale b streams %d orders, want 305", len(got))
	}
	checkAudit(t, tl.l, "b")
	archive("b")
	if b, r := orderKeys(t, tl.l); b != 0 || r != 1 {
		t.Fatalf("after archiving b: %d blocks and %d order records, want 0 and 1 (the held one)", b, r)
	}
	// The sequences stay known: an archived order's id is not new.
	take("n1", []TakeEntry{takes[300]}, stock.OutcomeClosed)
	checkAudit(t, tl.reopen(), "h")
}

func saleOrderIDsOf(want map[string]TakeEntry, sku string) []string {
	var ids []string
	for id, e := range want {
		if e.SKU == sku {
			ids = append(ids, id)
		}
	}
	return ids
}

// TestSeqWindow: a node's window says "no order" only for sequences above
// its floor, inside its span and not seen, across gaps and wrap-arounds.
func TestSeqWindow(t *testing.T) {
	w := &seqWindow{floor: 10, high: 10}
	seen := map[uint64]bool{}
	check := func() {
		t.Helper()
		for s := uint64(0); s <= w.high+2; s++ {
			want := s > 10 && s <= w.high && w.high-s < seqWindowBits && !seen[s]
			if got := w.unseen(s); got != want {
				t.Fatalf("high %d: unseen(%d) = %v, want %v", w.high, s, got, want)
			}
		}
	}
	for _, s := range []uint64{12, 11, 15, 13, 14, 15, 300, 20, 5000, 4990, 905, 904 + seqWindowBits, 5001 + 3*seqWindowBits, 4 + 3*seqWindowBits} {
		w.see(s)
		seen[s] = true
		check()
	}
}

// A block's value grows in place batch after batch, while what an earlier
// batch wrote (and the write-behind may still be writing) stays as it was;
// a value growBlock did not build is copied.
func TestGrowBlock_AppendsInPlaceAndKeepsWhatReadersHold(t *testing.T) {
	var l Ledger
	v1 := l.growBlock("b", nil, []byte{1, 2})
	if want := []byte{store.OrderBlockFormat, 1, 2}; !slices.Equal(v1, want) {
		t.Fatalf("first batch: %v, want %v", v1, want)
	}
	held := slices.Clone(v1)
	v2 := l.growBlock("b", v1, []byte{3})
	if &v2[0] != &v1[0] {
		t.Errorf("second batch copied the block instead of growing it")
	}
	if !slices.Equal(v1, held) {
		t.Errorf("the first batch's value changed under its reader: %v, was %v", v1, held)
	}
	if want := []byte{store.OrderBlockFormat, 1, 2, 3}; !slices.Equal(v2, want) {
		t.Fatalf("second batch: %v, want %v", v2, want)
	}
	// The same bytes read from the file are not growBlock's: copied.
	fromFile := slices.Clone(v2)
	v3 := l.growBlock("b", fromFile, []byte{4})
	if &v3[0] == &v2[0] || &v3[0] == &fromFile[0] {
		t.Errorf("a value read from the file was grown in place")
	}
	// An older value of the block (an apply that failed after growing it)
	// is copied too, and the newer one is left alone.
	v4 := l.growBlock("b", v1, []byte{9})
	if &v4[0] == &v1[0] || !slices.Equal(v2, []byte{store.OrderBlockFormat, 1, 2, 3}) {
		t.Errorf("an older value was grown in place: %v, newer %v", v4, v2)
	}
	for i := range 3 * growingBlocksMax {
		l.growBlock(strconv.Itoa(i), nil, []byte{byte(i)})
		if len(l.growingBlocks) > growingBlocksMax {
			t.Fatalf("%d growing blocks kept, at most %d", len(l.growingBlocks), growingBlocksMax)
		}
	}
}
