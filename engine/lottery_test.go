package engine

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"stockd/raftfsm"
	"stockd/stock"
)

// entryRaced is a ledger whose next EntryStatus misses the user's entry,
// as a node's does when the same entry, sent to another node as well,
// commits between that check and the next.
type entryRaced struct {
	Ledger
	miss atomic.Bool
}

func (l *entryRaced) EntryStatus(sku, user string) (stock.EntryStatus, bool, error) {
	if l.miss.CompareAndSwap(true, false) {
		return stock.EntryStatus{}, false, nil
	}
	return l.Ledger.EntryStatus(sku, user)
}

// An entry sent twice (to two nodes) is one entry: the twin that finds
// its request id already used, by this very entry committed since it
// looked for the user's entry, gets that entry, not request_id_reused. A
// request id the user spent on a purchase is still refused.
func TestEngine_EnterTwinCommittedMeanwhileIsTheSameEntry(t *testing.T) {
	var raced *entryRaced
	tn := startTestNodeWrapped(t, t.TempDir(), nil, nil,
		func(l *raftfsm.Ledger) Ledger { raced = &entryRaced{Ledger: l}; return raced })
	// Entries record their request ids under the current rules.
	waitUntil(t, "the ledger on the current rules", func() bool { return tn.ledger.Rules() == raftfsm.RulesCurrent })
	if _, err := tn.engine.CreateSale("lot", SaleSpec{Total: 5, Lottery: true, EntriesCloseAt: time.Now().Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	first, err := tn.engine.Enter(context.Background(), "lot", "fan", "r1")
	if err != nil {
		t.Fatal(err)
	}
	// The twin finds the request id used (the ledger may answer from its
	// file, written a moment after the commit).
	waitUntil(t, "the entry's request id recorded", func() bool {
		_, used := raced.LookupRequest([]byte("fan"), []byte("r1"))
		return used
	})
	raced.miss.Store(true)
	twin, err := tn.engine.Enter(context.Background(), "lot", "fan", "r1")
	if err != nil || twin.Seq != first.Seq {
		t.Fatalf("the twin: entry %+v, %v; want entry %d", twin, err, first.Seq)
	}
	if raced.miss.Load() {
		t.Fatal("the twin did not look for the entry: the test does not test what it says")
	}
	if _, err := tn.engine.CreateSale("tee", SaleSpec{Total: 5}); err != nil {
		t.Fatal(err)
	}
	if r := tn.deduct("tee", "buyer", "r2", 1, false); r.Status != StatusOK {
		t.Fatalf("deduct: %s", r.Status)
	}
	waitUntil(t, "the purchase's request id recorded", func() bool {
		_, used := raced.LookupRequest([]byte("buyer"), []byte("r2"))
		return used
	})
	raced.miss.Store(true)
	if _, err := tn.engine.Enter(context.Background(), "lot", "buyer", "r2"); !errors.Is(err, ErrRequestIDReused) {
		t.Fatalf("an entry on a purchase's request id: %v, want request_id_reused", err)
	}
	if a := tn.checkLedger("tee"); a.Row.Sold != 1 || a.OrdersSold != 1 {
		t.Fatalf("want one unit sold once: %+v", a)
	}
}
