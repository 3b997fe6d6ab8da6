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
	p := &pendingTake{done: make(chan struct{})}
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

	lone := &pendingTake{done: make(chan struct{})}
	lone.markTaken()
	if lone.taken != nil || !lone.wasTaken() {
		t.Fatalf("a take nobody waited on: channel %v, taken %v", lone.taken, lone.wasTaken())
	}
}
