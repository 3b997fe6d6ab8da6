package batcher

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

type item struct {
	id     int
	queued time.Time
}

// harness runs a batcher of items whose Commit hands each batch to the
// test and waits for the test to let it go (Verdict, then return).
type harness struct {
	t       *testing.T
	queue   chan *item
	batches chan []*item
	release chan struct{}
	given   chan struct{} // a verdict was given
	b       *Batcher[*item]
	stop    chan struct{}
	wg      sync.WaitGroup
	next    int
	taken   atomic.Int64 // items the batcher took from its queue (it sizes each once)
}

func newHarness(t *testing.T, linger time.Duration) *harness {
	h := &harness{t: t, queue: make(chan *item, 64), batches: make(chan []*item, 8), release: make(chan struct{}), given: make(chan struct{}), stop: make(chan struct{})}
	slots := make(chan struct{}, 1)
	h.b = &Batcher[*item]{
		Queue: h.queue, Stop: h.stop, WG: &h.wg,
		Size: func(*item) int { h.taken.Add(1); return 1 }, MaxItems: 1000, MaxBytes: 1 << 20,
		Slots:   func() chan struct{} { return slots },
		Linger:  func(chan struct{}) time.Duration { return linger },
		Abandon: func(*item) {},
		Queued:  func(it *item) time.Time { return it.queued },
	}
	h.b.Commit = func(batch []*item) {
		h.batches <- batch
		select {
		case <-h.release:
		case <-h.stop:
			return
		}
		h.b.Verdict()
		h.given <- struct{}{}
	}
	t.Cleanup(func() { close(h.stop); h.wg.Wait() })
	return h
}

// answer lets the batch in flight have its verdict.
func (h *harness) answer() {
	h.release <- struct{}{}
	<-h.given
}

func (h *harness) push(n int) {
	for range n {
		h.next++
		h.queue <- &item{id: h.next, queued: time.Now()}
	}
}

// pushEach queues n items one at a time, each once the batcher has taken
// the one before from the queue: a batch that stopped lingering too soon
// goes out without the later ones.
func (h *harness) pushEach(n int) {
	h.t.Helper()
	for range n {
		h.push(1)
		deadline := time.Now().Add(30 * time.Second)
		for h.taken.Load() < int64(h.next) {
			if time.Now().After(deadline) {
				h.t.Fatal("the batcher did not take an item from its queue in 30s")
			}
			time.Sleep(time.Millisecond)
		}
	}
}

// batch waits (up to a deadline far past any linger the tests expect to
// end early) for the next batch and checks its size.
func (h *harness) batch(want int) {
	h.t.Helper()
	select {
	case got := <-h.batches:
		if len(got) != want {
			h.t.Fatalf("a batch of %d items, want %d", len(got), want)
		}
	case <-time.After(30 * time.Second):
		h.t.Fatalf("no batch of %d items in 30s", want)
	}
}

// TestBatcher_ALingerEndsOnceTheWaveIsIn: with an hour's linger, a batch
// goes out as soon as it holds as many items as the last one (the wave of
// its callers came back), and one item waiting from before the last
// batch's verdict counts beside the wave, not in it.
func TestBatcher_ALingerEndsOnceTheWaveIsIn(t *testing.T) {
	h := newHarness(t, time.Hour)
	h.push(3)
	h.wg.Add(1)
	go h.b.Run()
	h.batch(3) // nothing came before: no linger
	h.answer()
	h.pushEach(3) // the wave comes back
	h.batch(3)

	// One item queued while that batch is in flight, then the wave.
	h.push(1)
	h.answer()
	h.pushEach(3)
	h.batch(4)
	h.answer()
}

// TestBatcher_ALingerShortOfTheWaveEndsWithItsTimer: when fewer callers
// come back than the last batch held, the batch goes with what came once
// the linger ends.
func TestBatcher_ALingerShortOfTheWaveEndsWithItsTimer(t *testing.T) {
	h := newHarness(t, 20*time.Millisecond)
	h.push(3)
	h.wg.Add(1)
	go h.b.Run()
	h.batch(3)
	h.answer()
	h.push(2)
	h.batch(2)
	h.answer()
}
