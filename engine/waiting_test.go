package engine

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"stockd.dev/stockd/raftfsm"
	"stockd.dev/stockd/raftfsm/command"
)

// availabilityReads counts the engine's reads of a sale's availability:
// what each buyer waiting for stock used to do at every poll tick.
type availabilityReads struct {
	*raftfsm.Ledger
	n atomic.Int64
}

func (l *availabilityReads) SKUAvailability(sku string) (available, leased int64, closed, ok bool) {
	l.n.Add(1)
	return l.Ledger.SKUAvailability(sku)
}

// TestEngine_WaitingBuyersShareOneLookAtTheLedger: a burst of buyers that
// wait for units another node holds is looked after by the poller, not
// by each buyer at each tick: the ledger is read about once a tick for
// all of them, plus a few times a buyer. They get try_again while the
// units are elsewhere, and sold_out, all of them and before their lease
// wait ends, once those units are sold.
func TestEngine_WaitingBuyersShareOneLookAtTheLedger(t *testing.T) {
	var reads *availabilityReads
	leaseWait := 400 * time.Millisecond
	tn := startTestNodeWrapped(t, t.TempDir(), func(c *Config) { c.LeaseWait = leaseWait }, nil,
		func(l *raftfsm.Ledger) Ledger { reads = &availabilityReads{Ledger: l}; return reads })
	const units, buyers = 10, 2000
	if _, err := tn.engine.CreateSale("far", SaleSpec{Total: units}); err != nil {
		t.Fatal(err)
	}
	// Every unit is leased to n2, a node that never gives any back.
	if res, err := tn.node.Propose(time.Now().UnixNano(), &command.Lease{Node: "n2", SKU: "far", Want: units}); err != nil || res.Qty != units {
		t.Fatalf("lease to n2: %+v %v", res, err)
	}
	burst := func(round string) map[Status]int {
		t.Helper()
		counts := map[Status]int{}
		var mu sync.Mutex
		var wg sync.WaitGroup
		for b := 0; b < buyers; b++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				res := tn.deduct("far", fmt.Sprintf("%s-%d", round, b), fmt.Sprintf("%s-r%d", round, b), 1, false)
				mu.Lock()
				counts[res.Status]++
				mu.Unlock()
			}()
		}
		wg.Wait()
		return counts
	}

	reads.n.Store(0)
	ticksBefore := tn.engine.poll.ticks.Load()
	if counts := burst("wait"); counts[StatusTryAgain] != buyers {
		t.Fatalf("buyers waiting for units held elsewhere: %v, want %d try_again", counts, buyers)
	}
	ticks := int64(tn.engine.poll.ticks.Load() - ticksBefore)
	// Each buyer reads on entering, at each wake-up of all (every
	// pollEvery ticks) and once more; the poller once a tick.
	bound := ticks + buyers*(ticks/pollEvery+3)
	if n := reads.n.Load(); n > bound {
		t.Fatalf("%d buyers waiting %d poll ticks read the sale's availability %d times, more than %d", buyers, ticks, n, bound)
	} else {
		t.Logf("%d buyers waiting %d poll ticks read the sale's availability %d times (each on its own at each tick: about %d)", buyers, ticks, n, buyers*ticks)
	}

	// Now the units are sold on n2 while a burst waits: every waiting
	// buyer learns it is over, well before its lease wait ends.
	tn.engine.cfg.LeaseWait = time.Minute // read by takeSlow as each buyer starts waiting
	done := make(chan map[Status]int)
	go func() { done <- burst("over") }()
	waitUntil(t, "the second burst waiting", func() bool {
		s := tn.engine.lookupSale([]byte("far"))
		return s != nil && s.waitingUnits.Load() == buyers
	})
	take := &command.Take{Node: "n2"}
	for i := 0; i < units; i++ {
		take.Entries = append(take.Entries, command.TakeEntry{SKU: "far", Qty: 1, User: fmt.Sprintf("elsewhere-%d", i), OrderID: fmt.Sprintf("n2-%d-x", i+1)})
	}
	if _, err := tn.node.Propose(time.Now().UnixNano(), take); err != nil {
		t.Fatal(err)
	}
	select {
	case counts := <-done:
		if counts[StatusSoldOut] != buyers {
			t.Fatalf("after n2 sold the last units: %v, want %d sold_out", counts, buyers)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("waiting buyers did not learn of the sell-out")
	}
	if a := tn.checkLedger("far"); a.Row.Sold != units || a.Orders != units {
		t.Fatalf("ledger sold %d in %d orders, want %d", a.Row.Sold, a.Orders, units)
	}
}
