package raftfsm

import (
	"stockd.dev/stockd/stock"
	"strconv"
	"testing"
)

// TestCompact_PurgedSaleGivesItsPagesBack archives and purges a sale of
// 20,000 orders beside one of 100 and compacts: the pages in use shrink
// below half, and what stays is all there after a reopen.
func TestCompact_PurgedSaleGivesItsPagesBack(t *testing.T) {
	const sold, batch = 8_000, 500
	tl := newTestLedger(t)
	tl.apply(legacyCommand{Op: OpCreateSale, SKU: "big", Sale: &SaleConfig{Total: sold}})
	tl.apply(legacyCommand{Op: OpCreateSale, SKU: "kept", Sale: &SaleConfig{Total: 100}})
	tl.apply(legacyCommand{Op: OpLease, Node: "n1", SKU: "big", Qty: sold})
	tl.apply(legacyCommand{Op: OpLease, Node: "n1", SKU: "kept", Qty: 100})
	for i := 0; i < sold; i += batch {
		c := &Take{Node: "n1", Entries: make([]TakeEntry, batch)}
		for k := range c.Entries {
			n := strconv.Itoa(i + k)
			c.Entries[k] = TakeEntry{SKU: "big", Qty: 1, User: "u" + n, RequestID: "r" + n, OrderID: "big-" + n}
		}
		for _, r := range tl.applyTyped(0, c).Takes {
			if r.Outcome != stock.OutcomeOK {
				t.Fatalf("take at %d: %s", i, r.Outcome)
			}
		}
		if err := tl.l.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 100 {
		n := strconv.Itoa(i)
		tl.apply(take("n1", "kept", "k"+n, "kept-"+n, 1))
	}
	if err := tl.l.Flush(); err != nil {
		t.Fatal(err)
	}
	full := tl.l.PagesInUse()
	tl.applyTyped(0, &CloseSale{SKU: "big"})
	if r := tl.applyTyped(0, &ArchiveSale{SKU: "big"}); r.Outcome != stock.OutcomeOK {
		t.Fatalf("archive: %s %s", r.Outcome, r.Detail)
	}
	tl.purgeArchived("big", 5_000)

	// The purge's last step starts a compaction in the background; this
	// one waits for it or follows it. The pages in use before the purge
	// are compared with what is left, not the file sizes: bbolt
	// preallocates 16 MiB past the commit that first outgrew the file, and
	// a file this small holds mostly that preallocation on either side.
	r, err := tl.l.Compact()
	if err != nil {
		t.Fatal(err)
	}
	left := tl.l.PagesInUse()
	t.Logf("pages in use: %d bytes before the purge, %d after the compaction (%+v)", full, left, r)
	if left == 0 || left*2 > full {
		t.Fatalf("compaction of a purged ledger left %d of %d bytes of pages in use, want below half", left, full)
	}
	l2 := tl.reopen()
	for i := range 100 {
		if _, ok, _ := l2.Order("kept-" + strconv.Itoa(i)); !ok {
			t.Fatalf("order kept-%d lost by the compaction", i)
		}
	}
	if _, ok, _ := l2.Order("big-7"); ok {
		t.Fatal("a purged order came back")
	}
	for _, sku := range []string{"big", "kept"} {
		checkAudit(t, l2, sku)
	}
	if row, _, _ := l2.SKU("big"); row.ArchivedSold != sold || row.Total != sold {
		t.Fatalf("the archived row after compaction: %+v", row)
	}
}
