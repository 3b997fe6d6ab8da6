package engine

import (
	"sync"
	"testing"
	"time"
)

// Repeats that wait for a take's unit are woken when it is taken, however
// their waits interleave with the take; once taken, a repeat needs no
// channel, and a take nobody waits on makes none.
func TestPendingTake_WhenTakenWakesEveryWaiter(t *testing.T) {
	p := &pendingTake{}
	if p.wasTaken() {
		t.Fatal("taken before markTaken")
	}
	const waiters = 16
	var wg sync.WaitGroup
	woken := make(chan bool, waiters)
	for range waiters {
		wg.Go(func() {
			ch, already := p.whenTaken()
			if already {
				woken <- true
				return
			}
			select {
			case <-ch:
				woken <- p.wasTaken()
			case <-time.After(10 * time.Second):
				woken <- false
			}
		})
	}
	p.markTaken()
	wg.Wait()
	close(woken)
	n := 0
	for ok := range woken {
		if !ok {
			t.Fatal("a waiter was not woken by markTaken, or woke before it")
		}
		n++
	}
	if n != waiters {
		t.Fatalf("%d waiters answered, want %d", n, waiters)
	}
	if ch, already := p.whenTaken(); !already || ch != nil {
		t.Fatalf("after markTaken: whenTaken = %v, %v; want nil, true", ch, already)
	}

	lone := &pendingTake{}
	lone.markTaken()
	if lone.taken != nil || !lone.wasTaken() {
		t.Fatalf("a take nobody waited on: channel %v, taken %v", lone.taken, lone.wasTaken())
	}
}

// Callers that block until a take is answered are woken by its answer,
// whether they asked before or after it; a take nobody blocks on makes
// no channel; onDone after the answer declines.
func TestPendingTake_WhenDoneWakesBlockersAndCostsNothingOtherwise(t *testing.T) {
	p := &pendingTake{}
	const waiters = 16
	var wg sync.WaitGroup
	woken := make(chan DeductResult, waiters)
	for range waiters {
		wg.Go(func() {
			select {
			case <-p.whenDone():
				r, ok := p.outcome()
				if !ok {
					r.Status = StatusUnavailable
				}
				woken <- r
			case <-time.After(10 * time.Second):
				woken <- DeductResult{Status: StatusOutcomeUnknown}
			}
		})
	}
	notified := 0
	for range 3 { // the first in its own slot, the rest in the slice
		if !p.onDone(func() { notified++ }) {
			t.Fatal("onDone declined before the answer")
		}
	}
	p.resolve(DeductResult{Status: StatusOK})
	wg.Wait()
	close(woken)
	for r := range woken {
		if r.Status != StatusOK {
			t.Fatalf("a blocked caller got %s, want the answer ok", r.Status)
		}
	}
	if notified != 3 {
		t.Fatalf("onDone's three functions ran %d times in all, want 3", notified)
	}
	select {
	case <-p.whenDone():
	default:
		t.Fatal("whenDone after the answer is not closed")
	}
	if p.onDone(func() { t.Error("called after the answer") }) {
		t.Fatal("onDone after the answer accepted a function")
	}

	lone := &pendingTake{}
	lone.resolve(DeductResult{Status: StatusOK})
	if lone.done != nil {
		t.Fatal("a take nobody blocked on made a channel")
	}
	if r, ok := lone.outcome(); !ok || r.Status != StatusOK {
		t.Fatalf("outcome after the answer: %v %v", r.Status, ok)
	}
}
