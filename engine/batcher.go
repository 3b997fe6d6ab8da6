package engine

import (
	"sync"
	"time"
)

// batcher is the group commit both of the engine's queues share (won
// takes, lottery entries). It waits for an item, then for a free proposal
// slot, then sends everything queued by then, up to maxItems items and
// maxBytes encoded, as one batch, committed on a goroutine of its own
// that holds the slot until the batch is answered. An item that does not
// fit starts the next batch. After a batch of more than one item it may
// linger for the rest of the wave (linger).
type batcher[T any] struct {
	queue    <-chan T
	stop     <-chan struct{}
	wg       *sync.WaitGroup
	header   int         // a batch's encoded bytes before its items
	size     func(T) int // an item's encoded bytes
	maxItems int
	maxBytes int
	// slots is where the next batch takes its slot (it may change with
	// leadership); linger, when set, how long a batch about to use slots
	// waits for more items after a batch of more than one.
	slots  func() chan struct{}
	linger func(slots chan struct{}) time.Duration
	// abandon answers the item held when the engine stops; commit
	// proposes a batch and answers its items.
	abandon func(T)
	commit  func([]T)
}

// run is the batcher's loop, until the engine stops (wg counts it).
func (b *batcher[T]) run() {
	defer b.wg.Done()
	var carry T // an item that did not fit the last batch, when held
	held := false
	lastBatch := 0 // items in the last batch
	for {
		first := carry
		if !held {
			select {
			case first = <-b.queue:
			case <-b.stop:
				return
			}
		}
		held = false
		slots := b.slots()
		select {
		case slots <- struct{}{}:
		case <-b.stop:
			b.abandon(first)
			return
		}
		batch := make([]T, 1, 64)
		batch[0] = first
		size := b.header + b.size(first)
		batch, size, carry, held = b.fill(batch, size, nil)
		// Under load items arrive in waves behind the batch that just came
		// back: waiting a moment sends one raft entry for the wave instead
		// of several (docs/architecture.md, "Choices made on the way").
		// After a lone item the node is not under load and sends at once.
		if lastBatch > 1 && !held && b.linger != nil {
			if d := b.linger(slots); d > 0 {
				t := time.NewTimer(d)
				batch, _, carry, held = b.fill(batch, size, t.C)
				t.Stop()
			}
		}
		lastBatch = len(batch)
		b.wg.Add(1)
		go func() {
			defer b.wg.Done()
			b.commit(batch)
			<-slots
		}()
	}
}

// fill adds queued items to a batch, up to maxItems and maxBytes encoded;
// carry (held) is an item that did not fit. With until nil it takes only
// what is queued now; otherwise it also waits for more until that fires
// (or the engine stops).
func (b *batcher[T]) fill(batch []T, size int, until <-chan time.Time) (_ []T, _ int, carry T, held bool) {
	for len(batch) < b.maxItems {
		var item T
		if until == nil {
			select {
			case item = <-b.queue:
			default:
				return batch, size, carry, false
			}
		} else {
			select {
			case item = <-b.queue:
			case <-until:
				return batch, size, carry, false
			case <-b.stop:
				return batch, size, carry, false
			}
		}
		if size += b.size(item); size > b.maxBytes {
			return batch, size, item, true
		}
		batch = append(batch, item)
	}
	return batch, size, carry, false
}
