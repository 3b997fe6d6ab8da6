package raftfsm

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"slices"
	"stockd.dev/stockd/raftfsm/lottery"
	"stockd.dev/stockd/stock"
	"testing"
)

// recomputeDraw ranks exported entries the way docs/feed-and-lottery.md writes the
// draw down, without the ledger's code: the hash chain, then the keys.
func recomputeDraw(t *testing.T, seed []byte, entries []stock.Entry) (hash []byte, ranked []int64) {
	t.Helper()
	hash = make([]byte, 32)
	for i, e := range entries {
		if e.Seq != int64(i+1) {
			t.Fatalf("entry %d has seq %d: the export is not in log order", i, e.Seq)
		}
		var n [4]byte
		binary.BigEndian.PutUint32(n[:], uint32(len(e.User)))
		sum := sha256.Sum256(slices.Concat(hash, n[:], []byte(e.User)))
		hash = sum[:]
	}
	type keyed struct {
		key []byte
		seq int64
	}
	keys := make([]keyed, len(entries))
	for i := range entries {
		var s [8]byte
		binary.BigEndian.PutUint64(s[:], uint64(i+1))
		sum := sha256.Sum256(slices.Concat(seed, hash, s[:]))
		keys[i] = keyed{sum[:], int64(i + 1)}
	}
	slices.SortFunc(keys, func(a, b keyed) int {
		if c := bytes.Compare(a.key, b.key); c != 0 {
			return c
		}
		return int(a.seq - b.seq)
	})
	for _, k := range keys {
		ranked = append(ranked, k.seq)
	}
	return hash, ranked
}

func TestLottery_DrawWaitlistAndLoss(t *testing.T) {
	tl := newTestLedger(t)
	secret := bytes.Repeat([]byte{7}, lottery.SecretBytes)
	cfg := SaleConfig{Total: 3, HoldTTLNanos: 1000, Mode: SaleModeLottery, EntriesCloseAtUnixNano: 100}
	if r := tl.applyTyped(1, &CreateSale{SKU: "lot", Sale: cfg, Secret: secret}); r.Outcome != stock.OutcomeOK {
		t.Fatalf("create: %s %s", r.Outcome, r.Detail)
	}
	other := bytes.Repeat([]byte{9}, lottery.SecretBytes)
	if r := tl.applyTyped(1, &CreateSale{SKU: "lot", Sale: cfg, Secret: other}); r.Outcome != stock.OutcomeSame {
		t.Fatalf("the same lottery again, with another secret: %s", r.Outcome)
	}
	if r := tl.applyTyped(1, &CreateSale{SKU: "bad", Sale: SaleConfig{Total: 1, Mode: SaleModeLottery}, Secret: secret}); r.Outcome != stock.OutcomeInvalid {
		t.Fatalf("a lottery without entries_close_at: %s", r.Outcome)
	}
	tl.applyTyped(1, &CreateSale{SKU: "plain", Sale: SaleConfig{Total: 1}})

	var batch Enter
	for i := range 10 {
		batch.Entries = append(batch.Entries, EnterEntry{SKU: "lot", User: fmt.Sprintf("u%d", i), RequestID: fmt.Sprintf("r%d", i)})
	}
	batch.Entries = append(batch.Entries, EnterEntry{SKU: "lot", User: "u3"}, EnterEntry{SKU: "plain", User: "u1"},
		EnterEntry{SKU: "nope", User: "u1"}, EnterEntry{SKU: "lot"})
	r := tl.applyTyped(10, &batch)
	for i := range 10 {
		if e := r.Entries[i]; e.Outcome != stock.OutcomeOK || e.Entry.Seq != int64(i+1) {
			t.Fatalf("entry %d: %s seq %d", i, e.Outcome, e.Entry.Seq)
		}
	}
	want := []stock.Outcome{stock.OutcomeSame, stock.OutcomeNotLottery, stock.OutcomeUnknownSKU, stock.OutcomeInvalid}
	for i, w := range want {
		if got := r.Entries[10+i].Outcome; got != w {
			t.Fatalf("entry %d: %s, want %s", 10+i, got, w)
		}
	}
	if r.Entries[10].Entry.Seq != 4 {
		t.Fatalf("a repeat entry answers seq %d, want the first's 4", r.Entries[10].Entry.Seq)
	}
	if r := tl.applyTyped(100, &Enter{Entries: []EnterEntry{{SKU: "lot", User: "late"}}}); r.Entries[0].Outcome != stock.OutcomeEntriesClosed {
		t.Fatalf("an entry at the close: %s", r.Entries[0].Outcome)
	}
	if r := tl.applyTyped(10, &Lease{Node: "n1", SKU: "lot", Want: 1}); r.Outcome != stock.OutcomeLottery {
		t.Fatalf("a lease of a lottery: %s", r.Outcome)
	}
	if st, ok, _ := tl.l.EntryStatus("lot", "u5"); !ok || st.State != stock.EntryEntered {
		t.Fatalf("before the draw: %+v %v", st, ok)
	}
	if r := tl.applyTyped(99, &Draw{SKU: "lot"}); r.Outcome != stock.OutcomeInvalidState {
		t.Fatalf("a draw before the close: %s", r.Outcome)
	}
	if r := tl.applyTyped(100, &Draw{SKU: "lot"}); r.Outcome != stock.OutcomeOK || r.Qty != 3 {
		t.Fatalf("draw: %s %d", r.Outcome, r.Qty)
	}
	if r := tl.applyTyped(101, &Draw{SKU: "lot"}); r.Outcome != stock.OutcomeSame || r.Qty != 3 {
		t.Fatalf("a second draw: %s %d", r.Outcome, r.Qty)
	}

	var entries []stock.Entry
	if _, err := tl.l.SaleEntries("lot", func(e *stock.Entry) error { entries = append(entries, *e); return nil }); err != nil {
		t.Fatal(err)
	}
	row := tl.row("lot")
	hash, ranked := recomputeDraw(t, secret[:32], entries)
	if len(entries) != 10 || !bytes.Equal(hash, row.Lottery.EntriesHash) {
		t.Fatalf("%d entries exported; hash %x, the ledger's %x", len(entries), hash, row.Lottery.EntriesHash)
	}
	user := func(seq int64) string { return entries[seq-1].User }
	check := func(won int64, lost bool) {
		t.Helper()
		for rank, seq := range ranked {
			st, ok, err := tl.l.EntryStatus("lot", user(seq))
			if err != nil || !ok {
				t.Fatalf("status of %s: %v %v", user(seq), ok, err)
			}
			switch {
			case int64(rank) < won:
				if st.State != stock.EntryWon || st.OrderID == "" {
					t.Fatalf("rank %d (%s): %+v, want won", rank+1, user(seq), st)
				}
				o, ok, _ := tl.l.Order(st.OrderID)
				if !ok || o.User != user(seq) || o.SKU != "lot" {
					t.Fatalf("winner %s's order %q: %+v %v", user(seq), st.OrderID, o, ok)
				}
			case lost:
				if st.State != stock.EntryLost {
					t.Fatalf("rank %d: %+v, want lost", rank+1, st)
				}
			default:
				if st.State != stock.EntryWaitlisted || st.Position != int64(rank)+1-won {
					t.Fatalf("rank %d: %+v, want waitlisted at %d", rank+1, st, int64(rank)+1-won)
				}
			}
		}
		checkAudit(t, tl.l, "lot")
	}
	check(3, false)

	// A cancelled winner's unit goes to the first waitlisted entry; an
	// expired one's to the next.
	first, _, _ := tl.l.EntryStatus("lot", user(ranked[0]))
	if r := tl.applyTyped(200, &Release{OrderID: first.OrderID, Reason: stock.ReleaseCancelled}); r.Outcome != stock.OutcomeOK {
		t.Fatalf("cancel: %s", r.Outcome)
	}
	check(4, false)
	second, _, _ := tl.l.EntryStatus("lot", user(ranked[1]))
	if r := tl.applyTyped(1100, &Expire{OrderIDs: []string{second.OrderID}}); r.Qty != 1 {
		t.Fatalf("expire: %d", r.Qty)
	}
	check(5, false)

	// Reopened, the ledger ranks the same.
	tl.l.Close()
	l, err := OpenLedger(tl.dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	tl.l = l
	t.Cleanup(func() { l.Close() })
	check(5, false)

	// Once every held winner confirmed, no unit can come back: the rest lost.
	for _, seq := range ranked[2:5] {
		st, _, _ := tl.l.EntryStatus("lot", user(seq))
		if r := tl.applyTyped(1100, &Confirm{OrderID: st.OrderID}); r.Outcome != stock.OutcomeOK && r.Outcome != stock.OutcomeExpired {
			t.Fatalf("confirm: %s", r.Outcome)
		}
	}
	row = tl.row("lot")
	if row.Held != 0 || row.Lottery.WaitlistLostAtUnixNano == 0 {
		t.Fatalf("after the confirms: held %d, waitlist lost at %d", row.Held, row.Lottery.WaitlistLostAtUnixNano)
	}
	won := row.Lottery.Won()
	check(won, true)
	if r := tl.applyTyped(1200, &Restock{SKU: "lot", Qty: 1}); r.Outcome != stock.OutcomeLottery {
		t.Fatalf("restock after the waitlist lost: %s", r.Outcome)
	}
}
func TestLottery_ArchiveTakesTheEntriesOut(t *testing.T) {
	tl := newTestLedger(t)
	secret := bytes.Repeat([]byte{3}, lottery.SecretBytes)
	cfg := SaleConfig{Total: 4, Mode: SaleModeLottery, EntriesCloseAtUnixNano: 100}
	tl.applyTyped(1, &CreateSale{SKU: "lot", Sale: cfg, Secret: secret})
	tl.applyTyped(1, &CreateSale{SKU: "keep", Sale: cfg, Secret: secret})
	var batch Enter
	for i := range 25 {
		for _, sku := range []string{"lot", "keep"} {
			batch.Entries = append(batch.Entries, EnterEntry{SKU: sku, User: fmt.Sprintf("u%d", i)})
		}
	}
	tl.applyTyped(10, &batch)
	for _, sku := range []string{"lot", "keep"} {
		if r := tl.applyTyped(100, &Draw{SKU: sku}); r.Outcome != stock.OutcomeOK || r.Qty != 4 {
			t.Fatalf("draw %s: %s %d", sku, r.Outcome, r.Qty)
		}
	}
	// Sold at the draw (no hold_ttl): nothing can come back, the rest lost.
	if st, _, _ := tl.l.EntryStatus("lot", "u0"); st.State != stock.EntryWon && st.State != stock.EntryLost {
		t.Fatalf("u0 after the draw: %+v", st)
	}
	tl.applyTyped(200, &CloseSale{SKU: "lot"})
	if r := tl.applyTyped(200, &ArchiveSale{SKU: "lot"}); r.Outcome != stock.OutcomeOK {
		t.Fatalf("archive: %s %s", r.Outcome, r.Detail)
	}
	after, steps := "", 0
	for ; steps < 100; steps++ {
		r := tl.applyTyped(300, &PurgeArchived{SKU: "lot", After: after, Scan: 7})
		if r.Outcome != stock.OutcomeOK {
			t.Fatalf("purge step %d: %s %s", steps, r.Outcome, r.Detail)
		}
		row := tl.row("lot")
		if row.PurgeDone {
			break
		}
		after = row.PurgeAfter
	}
	row := tl.row("lot")
	if !row.PurgeDone || row.Lottery.PurgedEntries != 25 || row.ArchivedOrders != 4 || row.Sold != 4 {
		t.Fatalf("after %d steps: %+v %+v", steps, row, row.Lottery)
	}
	n := 0
	if _, err := tl.l.SaleEntries("lot", func(*stock.Entry) error { n++; return nil }); err != nil || n != 0 {
		t.Fatalf("%d entries of the archived lottery left (%v)", n, err)
	}
	if _, ok, _ := tl.l.EntryStatus("lot", "u3"); ok {
		t.Fatal("an archived lottery's entrant still has an entry")
	}
	n = 0
	if _, err := tl.l.SaleEntries("keep", func(*stock.Entry) error { n++; return nil }); err != nil || n != 25 {
		t.Fatalf("the other lottery kept %d entries, want 25 (%v)", n, err)
	}
	if st, ok, _ := tl.l.EntryStatus("keep", "u3"); !ok || (st.State != stock.EntryWon && st.State != stock.EntryLost) {
		t.Fatalf("the other lottery's entrant: %+v %v", st, ok)
	}
	checkAudit(t, tl.l, "lot")
	checkAudit(t, tl.l, "keep")
}

// TestLottery_DrawnWithNoEntriesCloses: no entrant can win, and a
// lottery takes no deducts, so under RulesEmptyDrawCloses the draw closes
// the sale with its units available; under the rules before, the same log
// leaves it open (what such a ledger always did), so that nodes of both
// versions apply the log alike.
func TestLottery_DrawnWithNoEntriesCloses(t *testing.T) {
	f := func(rules uint64, wantClosed bool) {
		t.Helper()
		tl := newTestLedger(t)
		tl.applyTyped(0, &SetRules{Rules: rules})
		secret := bytes.Repeat([]byte{7}, lottery.SecretBytes)
		cfg := SaleConfig{Total: 3, Mode: SaleModeLottery, EntriesCloseAtUnixNano: 100}
		if r := tl.applyTyped(1, &CreateSale{SKU: "empty", Sale: cfg, Secret: secret}); r.Outcome != stock.OutcomeOK {
			t.Fatalf("create: %s %s", r.Outcome, r.Detail)
		}
		if r := tl.applyTyped(200, &Draw{SKU: "empty"}); r.Outcome != stock.OutcomeOK || r.Qty != 0 {
			t.Fatalf("rules %d: the draw: %s %d", rules, r.Outcome, r.Qty)
		}
		row, _, ok := tl.l.SKU("empty")
		if !ok {
			t.Fatalf("rules %d: the sale is gone", rules)
		}
		if row.Closed() != wantClosed || row.Available != 3 || row.Sold != 0 || !row.Lottery.Drawn() {
			t.Fatalf("rules %d: after an empty draw: closed %v, %d available, %d sold; want closed %v with 3 available", rules, row.Closed(), row.Available, row.Sold, wantClosed)
		}
		if r := tl.applyTyped(300, &Draw{SKU: "empty"}); r.Outcome != stock.OutcomeSame {
			t.Fatalf("rules %d: the draw again: %s, want same", rules, r.Outcome)
		}
		checkAudit(t, tl.l, "empty")
	}
	f(RulesNamedPurges, false)
	f(RulesEmptyDrawCloses, true)
}
