package raftfsm

import (
	"fmt"
	"stockd.dev/stockd/stock"
	"testing"
)

func TestArchive_ClosedSaleLeavesTheLedgerAndItsTotalsStay(t *testing.T) {
	tl := newTestLedger(t)
	tl.apply(legacyCommand{Op: OpCreateSale, SKU: "a", Sale: &SaleConfig{Total: 100, PerUser: 1}})
	tl.apply(legacyCommand{Op: OpCreateSale, SKU: "b", Sale: &SaleConfig{Total: 100}})
	tl.apply(legacyCommand{Op: OpCreateSale, SKU: "h", Sale: &SaleConfig{Total: 10, HoldTTLNanos: 1000}})
	for _, sku := range []string{"a", "b", "h"} {
		tl.apply(legacyCommand{Op: OpLease, Node: "n1", SKU: sku, Qty: 60})
	}
	for i := range 40 {
		tl.apply(take("n1", "a", fmt.Sprintf("u%d", i), fmt.Sprintf("a%02d", i), 1))
		tl.apply(take("n1", "b", fmt.Sprintf("u%d", i), fmt.Sprintf("b%02d", i), 1))
	}
	tl.apply(take("n1", "h", "u1", "h1", 1))

	// Archiving needs a closed sale, no held unit, and every consumer past
	// the sale's last event.
	if r := tl.applyTyped(0, &ArchiveSale{SKU: "a"}); r.Outcome != stock.OutcomeNotClosed {
		t.Fatalf("archive of an open sale: %s", r.Outcome)
	}
	if r := tl.applyTyped(0, &CloseSale{SKU: "a"}); r.Outcome != stock.OutcomeOK || r.Qty != 20 {
		t.Fatalf("close: %s, %d units back", r.Outcome, r.Qty)
	}
	if row := tl.row("a"); row.LeasedTotal() != 0 || row.Available != 60 || !row.Closed() {
		t.Fatalf("closed row %+v", row)
	}
	if r := tl.apply(take("n1", "a", "late", "a99", 1)); r.Takes[0].Outcome != stock.OutcomeClosed {
		t.Fatalf("take on a closed sale: %s", r.Takes[0].Outcome)
	}
	if r := tl.apply(legacyCommand{Op: OpLease, Node: "n1", SKU: "a", Qty: 1}); r.Outcome != stock.OutcomeClosed {
		t.Fatalf("lease on a closed sale: %s", r.Outcome)
	}
	if r := tl.apply(legacyCommand{Op: OpRestock, SKU: "a", Qty: 1}); r.Outcome != stock.OutcomeClosed {
		t.Fatalf("restock of a closed sale: %s", r.Outcome)
	}
	tl.applyTyped(0, &CloseSale{SKU: "h"})
	if r := tl.applyTyped(0, &ArchiveSale{SKU: "h"}); r.Outcome != stock.OutcomeHoldsPending {
		t.Fatalf("archive with a held unit: %s", r.Outcome)
	}
	var feed feedTally
	feed.readAll(t, tl.l)
	if r := tl.applyTyped(0, &AckConsumer{Name: "shop", Cursor: feed.events[10].Cursor()}); r.Outcome != stock.OutcomeOK {
		t.Fatalf("ack: %s", r.Outcome)
	}
	if r := tl.applyTyped(0, &ArchiveSale{SKU: "a"}); r.Outcome != stock.OutcomeUnconsumed {
		t.Fatalf("archive with unacknowledged events: %s", r.Outcome)
	}
	tl.applyTyped(0, &AckConsumer{Name: "shop", Cursor: feed.last})
	if r := tl.applyTyped(0, &ArchiveSale{SKU: "a"}); r.Outcome != stock.OutcomeOK {
		t.Fatalf("archive: %s %s", r.Outcome, r.Detail)
	}
	before := tl.row("a")

	// The purge, in steps of 7 records; a stale step is a no-op.
	tl.purgeArchived("a", 7)
	if r := tl.applyTyped(0, &PurgeArchived{SKU: "a", After: "", Scan: 7}); r.Outcome != stock.OutcomeSame {
		t.Fatalf("a stale purge step: %s", r.Outcome)
	}
	row := tl.row("a")
	if !row.PurgeDone || row.ArchivedOrders != 40 || row.ArchivedSold != 40 || row.Sold != before.Sold || row.Total != before.Total {
		t.Fatalf("archived row %+v (before %+v)", row, before)
	}
	for i := range 40 {
		if _, ok, _ := tl.l.Order(fmt.Sprintf("a%02d", i)); ok {
			t.Fatalf("archived order a%02d still readable", i)
		}
		if _, ok := tl.l.OrderIDForRequest(fmt.Sprintf("u%d", i), fmt.Sprintf("req-a%02d", i)); ok {
			t.Fatalf("request id of archived order a%02d still held", i)
		}
		if _, ok, _ := tl.l.Order(fmt.Sprintf("b%02d", i)); !ok {
			t.Fatalf("order b%02d of another sale went too", i)
		}
	}
	if n := tl.l.BoughtBytes([]byte("a"), []byte("u1")); n != 0 {
		t.Fatalf("a buyer of the archived sale still counts %d units", n)
	}
	for _, sku := range []string{"a", "b", "h"} {
		checkAudit(t, tl.l, sku)
	}

	// Compaction keeps everything and survives a reopen. How much it
	// gives back is TestCompact_PurgedSaleGivesItsPagesBack's: a file this
	// small is mostly bbolt's preallocation, whose size depends on when
	// the persister committed.
	r, err := tl.l.Compact()
	if err != nil || r.Before == 0 || r.After == 0 || r.PagesAfter == 0 {
		t.Fatalf("compact: %+v %v", r, err)
	}
	tl.apply(take("n1", "b", "after", "b99", 1))
	l2 := tl.reopen()
	for _, id := range []string{"b00", "b39", "b99"} {
		if _, ok, _ := l2.Order(id); !ok {
			t.Fatalf("order %s lost by the compaction", id)
		}
	}
	for _, sku := range []string{"a", "b", "h"} {
		checkAudit(t, l2, sku)
	}
	var again feedTally
	again.readAll(t, l2)
	if again.last.Seq < feed.last.Seq {
		t.Fatalf("the feed lost events in the compaction: %s < %s", again.last, feed.last)
	}
}

// purgeArchived applies PurgeArchived steps of scan records to an archived
// sale until one says it is done, and fails past 100 steps.
func (t *testLedger) purgeArchived(sku string, scan int64) {
	t.tb.Helper()
	after := ""
	for steps := 0; ; steps++ {
		if steps == 100 {
			t.tb.Fatalf("the purge of %s did not end in 100 steps", sku)
		}
		r := t.applyTyped(0, &PurgeArchived{SKU: sku, After: after, Scan: scan})
		if r.Outcome != stock.OutcomeOK {
			t.tb.Fatalf("purge step %d of %s: %s %s", steps, sku, r.Outcome, r.Detail)
		}
		if r.Detail == "done" {
			return
		}
		after = t.row(sku).PurgeAfter
	}
}
