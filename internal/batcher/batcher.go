// Package batcher is a group commit: items queued by many goroutines go
// out in batches, one proposal slot at a time.
package batcher

import (
	"sync"
	"sync/atomic"
	"time"
)

// Batcher is the group commit the engine's queues share (won takes,
// lottery entries). It waits for an item, then for a free proposal
// slot, then sends everything queued by then, up to MaxItems items and
// MaxBytes encoded, as one batch, committed on a goroutine of its own
// that holds the slot until the batch is answered. An item that does not
// fit starts the next batch. After a batch of more than one item it may
// linger for the rest of the wave (Linger).
type Batcher[T any] struct {
	Queue    <-chan T
	Stop     <-chan struct{}
	WG       *sync.WaitGroup
	Header   int         // a batch's encoded bytes before its items
	Size     func(T) int // an item's encoded bytes
	MaxItems int
	MaxBytes int
	// Slots is where the next batch takes its slot (it may change with
	// leadership); Linger, when set, how long a batch about to use slots
	// waits for more items after a batch of more than one.
	Slots  func() chan struct{}
	Linger func(slots chan struct{}) time.Duration
	// Abandon answers the item held when the engine stops; Commit
	// proposes a batch and answers its items.
	Abandon func(T)
	Commit  func([]T)
	// Queued, when set, is when an item was queued (on the real clock);
	// with Commit calling Verdict, a linger then tells the wave coming
	// back from the last batch from items that were waiting before it.
	Queued func(T) time.Time

	verdict atomic.Int64 // UnixNano of the last Verdict
}

// Verdict tells the batcher (nil: none) that a batch's proposal came
// back, before its items are answered: items queued after it belong to
// the wave of callers coming back.
func (b *Batcher[T]) Verdict() {
	if b != nil {
		b.verdict.Store(time.Now().UnixNano())
	}
}

// Run is the batcher's loop, until Stop closes (WG counts it).
func (b *Batcher[T]) Run() {
	defer b.WG.Done()
	var carry T // an item that did not fit the last batch, when held
	held := false
	lastBatch := 0 // items in the last batch
	for {
		first := carry
		if !held {
			select {
			case first = <-b.Queue:
			case <-b.Stop:
				return
			}
		}
		held = false
		slots := b.Slots()
		select {
		case slots <- struct{}{}:
		case <-b.Stop:
			b.Abandon(first)
			return
		}
		batch := make([]T, 1, 64)
		batch[0] = first
		size := b.Header + b.Size(first)
		batch, size, carry, held = b.fill(batch, size, nil, 0)
		// Under load items arrive in waves behind the batch that just came
		// back: waiting a moment sends one raft entry for the wave instead
		// of several (docs/architecture.md, "Choices made on the way").
		// After a lone item the node is not under load and sends at once.
		// The wait ends early once the wave is in: as many items as the
		// last batch had (its callers got their answers together and came
		// back) beside those that were waiting before its verdict; waiting
		// on only delays everyone in it.
		if lastBatch > 1 && !held && b.Linger != nil {
			if d := b.Linger(slots); d > 0 {
				if want := lastBatch + b.waitedBefore(batch); len(batch) < want {
					t := time.NewTimer(d)
					batch, _, carry, held = b.fill(batch, size, t.C, want)
					t.Stop()
				}
			}
		}
		lastBatch = len(batch)
		b.WG.Add(1)
		go func() {
			defer b.WG.Done()
			b.Commit(batch)
			<-slots
		}()
	}
}

// waitedBefore counts the items of batch queued before the last verdict.
func (b *Batcher[T]) waitedBefore(batch []T) int {
	v := b.verdict.Load()
	if b.Queued == nil || v == 0 {
		return 0
	}
	n := 0
	for _, item := range batch {
		if b.Queued(item).UnixNano() < v {
			n++
		}
	}
	return n
}

// fill adds queued items to a batch, up to maxItems and maxBytes encoded;
// carry (held) is an item that did not fit. With until nil it takes only
// what is queued now; otherwise it also waits for more until that fires,
// the batch holds want items, or the engine stops.
func (b *Batcher[T]) fill(batch []T, size int, until <-chan time.Time, want int) (_ []T, _ int, carry T, held bool) {
	for len(batch) < b.MaxItems {
		if until != nil && len(batch) >= want {
			// What is queued still joins; the wait is over.
			until = nil
		}
		var item T
		if until == nil {
			select {
			case item = <-b.Queue:
			default:
				return batch, size, carry, false
			}
		} else {
			select {
			case item = <-b.Queue:
			case <-until:
				return batch, size, carry, false
			case <-b.Stop:
				return batch, size, carry, false
			}
		}
		if size += b.Size(item); size > b.MaxBytes {
			return batch, size, item, true
		}
		batch = append(batch, item)
	}
	return batch, size, carry, false
}
