package control

import (
	"context"
	"errors"
	"fmt"
	"stockd.dev/stockd/engine"
	"stockd.dev/stockd/raftfsm"
	"stockd.dev/stockd/stock"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestPlane_HoldsConfirmCancelAndExpire(t *testing.T) {
	var clock fakeClock
	tn := startTestNode(t, t.TempDir(), func(c *engine.Config) { c.Now = clock.now })
	if _, err := tn.plane.CreateSale("a", SaleSpec{Total: 3, HoldTTL: 10 * time.Second}); err != nil {
		t.Fatal(err)
	}
	var held []engine.DeductResult
	for i := 0; i < 3; i++ {
		r := tn.deduct("a", fmt.Sprintf("u%d", i), fmt.Sprintf("r%d", i), 1, false)
		if r.Status != engine.StatusOK || r.Order.State != stock.OrderHeld {
			t.Fatalf("deduct %d: %s %s", i, r.Status, r.Order.State)
		}
		held = append(held, r)
	}
	if r := tn.deduct("a", "late", "r-late", 1, false); r.Status != engine.StatusSoldOut {
		t.Fatalf("deduct with every unit held: %s", r.Status)
	}
	// u0 pays, u1 cancels, u2 never pays.
	paid, err := tn.plane.Confirm(held[0].Order.ID)
	if err != nil || paid.State != stock.OrderSold {
		t.Fatalf("confirm: %v %s", err, paid.State)
	}
	if again, err := tn.plane.Confirm(held[0].Order.ID); err != nil || again != paid {
		t.Fatalf("confirm twice: %v %+v", err, again)
	}
	if _, err := tn.plane.Cancel(held[0].Order.ID); !errors.Is(err, engine.ErrInvalidState) {
		t.Fatalf("cancel after confirm: %v", err)
	}
	if o, err := tn.plane.Cancel(held[1].Order.ID); err != nil || o.State != stock.OrderReleased {
		t.Fatalf("cancel: %v %s", err, o.State)
	}
	// The cancelled unit is back on sale.
	late := tn.deduct("a", "late", "r-late-2", 1, false)
	if late.Status != engine.StatusOK {
		t.Fatalf("deduct after a cancel: %s", late.Status)
	}
	clock.advance(11 * time.Second)
	waitUntil(t, "the leader expires u2's hold", func() bool {
		o, _, _ := tn.plane.Order(held[2].Order.ID)
		return o.State == stock.OrderReleased
	})
	if _, err := tn.plane.Confirm(held[2].Order.ID); !errors.Is(err, engine.ErrExpired) {
		t.Fatalf("confirm after expiry: %v", err)
	}
	// late's hold, taken before the clock moved, is over too.
	if o, _, _ := tn.plane.Order(late.Order.ID); o.State != stock.OrderReleased || o.ReleaseReason != stock.ReleaseExpired {
		t.Fatalf("late's order: %s %s", o.State, o.ReleaseReason)
	}
	if r := tn.deduct("a", "later", "r-later", 1, false); r.Status != engine.StatusOK {
		t.Fatalf("deduct after an expiry: %s", r.Status)
	}
	a := tn.checkLedger("a")
	if a.Row.Sold != 1 || a.Row.Held != 1 || a.Row.Available+a.Row.LeasedTotal() != 1 {
		t.Fatalf("row %+v", a.Row)
	}
}

// Confirms and cancels of one held order racing each other and the hold's
// expiry: the ledger decides them in log order, so one fate wins, each
// answer agrees with the order's final state (a cancel of an expired hold
// answers ok, released as expired), and a later read never contradicts an
// answer already given. Run over many held orders at
// once, with the clock moved past their hold midway.
func TestPlane_ConfirmsAndCancelsRacingOnOneOrderAgree(t *testing.T) {
	var clock fakeClock
	tn := startTestNode(t, t.TempDir(), func(c *engine.Config) { c.Now = clock.now })
	const orders, racers = 40, 6
	if _, err := tn.plane.CreateSale("a", SaleSpec{Total: orders, HoldTTL: 10 * time.Second}); err != nil {
		t.Fatal(err)
	}
	ids := make([]string, orders)
	for i := range ids {
		r := tn.deduct("a", fmt.Sprintf("u%d", i), fmt.Sprintf("r%d", i), 1, false)
		if r.Status != engine.StatusOK || r.Order.State != stock.OrderHeld {
			t.Fatalf("deduct %d: %s %s", i, r.Status, r.Order.State)
		}
		ids[i] = r.Order.ID
	}
	type answer struct {
		confirm bool
		state   stock.OrderState
		reason  string
		err     error
	}
	answers := make([][]answer, orders)
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i, id := range ids {
		for k := range racers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				confirm := k%2 == 0
				if i == orders/2 && k == 0 {
					clock.advance(11 * time.Second) // the rest race the expiry too
				}
				var o stock.Order
				var err error
				if confirm {
					o, err = tn.plane.Confirm(id)
				} else {
					o, err = tn.plane.Cancel(id)
				}
				mu.Lock()
				answers[i] = append(answers[i], answer{confirm, o.State, o.ReleaseReason, err})
				mu.Unlock()
			}()
		}
	}
	wg.Wait()
	sold, fates := 0, map[string]int{}
	for i, id := range ids {
		waitUntil(t, "order "+id+" is settled", func() bool {
			o, _, _ := tn.plane.Order(id)
			return o.State == stock.OrderSold || o.State == stock.OrderReleased
		})
		final, _, _ := tn.plane.Order(id)
		fates[string(final.State)+" "+final.ReleaseReason]++
		if final.State == stock.OrderSold {
			sold++
		}
		for _, a := range answers[i] {
			switch {
			case a.err == nil && a.confirm && (a.state != stock.OrderSold || final.State != stock.OrderSold):
				t.Errorf("order %s: a confirm answered ok (%s), the order ended %s", id, a.state, final.State)
			case a.err == nil && !a.confirm && (a.state != stock.OrderReleased || a.state != final.State || a.reason != final.ReleaseReason):
				// A cancel of a hold that expired answers ok with the
				// order released as expired: what the buyer asked for.
				t.Errorf("order %s: a cancel answered ok (%s %q), the order ended %s %q", id, a.state, a.reason, final.State, final.ReleaseReason)
			case a.err != nil && !errors.Is(a.err, engine.ErrInvalidState) && !errors.Is(a.err, engine.ErrExpired):
				t.Errorf("order %s: an answer %v, want ok, invalid_state or expired", id, a.err)
			case errors.Is(a.err, engine.ErrExpired) && (final.State != stock.OrderReleased || final.ReleaseReason != stock.ReleaseExpired):
				t.Errorf("order %s: answered expired, the order ended %s %q", id, final.State, final.ReleaseReason)
			case errors.Is(a.err, engine.ErrInvalidState) && a.confirm && final.State == stock.OrderSold:
				t.Errorf("order %s: a confirm was refused though the order ended sold", id)
			case errors.Is(a.err, engine.ErrInvalidState) && !a.confirm && final.State == stock.OrderReleased && final.ReleaseReason == stock.ReleaseCancelled:
				t.Errorf("order %s: a cancel was refused though the order ended cancelled", id)
			}
		}
	}
	a := tn.checkLedger("a")
	if a.Row.Sold != int64(sold) || a.Row.Held != 0 {
		t.Fatalf("the ledger's row %+v; want %d sold, none held", a.Row, sold)
	}
	t.Logf("the orders' fates: %v", fates)
}

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
func TestPlane_EnterTwinCommittedMeanwhileIsTheSameEntry(t *testing.T) {
	var raced *entryRaced
	tn := startTestNodeWrapped(t, t.TempDir(), nil,
		func(l *raftfsm.Ledger) Ledger { raced = &entryRaced{Ledger: l}; return raced })
	// Entries record their request ids under the current rules.
	waitUntil(t, "the ledger on the current rules", func() bool { return tn.ledger.Rules() == raftfsm.RulesCurrent })
	if _, err := tn.plane.CreateSale("lot", SaleSpec{Total: 5, Lottery: true, EntriesCloseAt: time.Now().Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	first, err := tn.plane.Enter(context.Background(), "lot", "fan", "r1")
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
	twin, err := tn.plane.Enter(context.Background(), "lot", "fan", "r1")
	if err != nil || twin.Seq != first.Seq {
		t.Fatalf("the twin: entry %+v, %v; want entry %d", twin, err, first.Seq)
	}
	if raced.miss.Load() {
		t.Fatal("the twin did not look for the entry: the test does not test what it says")
	}
	if _, err := tn.plane.CreateSale("tee", SaleSpec{Total: 5}); err != nil {
		t.Fatal(err)
	}
	if r := tn.deduct("tee", "buyer", "r2", 1, false); r.Status != engine.StatusOK {
		t.Fatalf("deduct: %s", r.Status)
	}
	waitUntil(t, "the purchase's request id recorded", func() bool {
		_, used := raced.LookupRequest([]byte("buyer"), []byte("r2"))
		return used
	})
	raced.miss.Store(true)
	if _, err := tn.plane.Enter(context.Background(), "lot", "buyer", "r2"); !errors.Is(err, ErrRequestIDReused) {
		t.Fatalf("an entry on a purchase's request id: %v, want request_id_reused", err)
	}
	if a := tn.checkLedger("tee"); a.Row.Sold != 1 || a.OrdersSold != 1 {
		t.Fatalf("want one unit sold once: %+v", a)
	}
}
