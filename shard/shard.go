// Package shard holds a SKU's node-local stock in per-core buckets.
//
// A Buckets value splits the units this node has been granted by the ledger
// into cache-line padded atomic counters. Take decrements one counter with a
// CAS, starting at a bucket chosen by the caller (a sticky hint such as a
// connection or worker index, so that concurrent takers rarely touch the same
// cache line) and stealing from siblings when that bucket is short. Nothing in
// this package takes a mutex, allocates on the take path, or does I/O.
//
// All methods are safe for concurrent use from any goroutine.
package shard

import (
	"fmt"
	"stockd.dev/stockd/internal/counter"
	"sync/atomic"
)

// Each counter is a counter.Int64, alone on its pair of cache lines:
// adjacent-line prefetch on x86 makes 64 bytes too little in practice.

// MaxBuckets bounds the number of buckets per SKU; more buckets than cores
// only spread stock thinner and make sibling scans longer.
const MaxBuckets = 256

// Buckets is one SKU's node-local stock, split over per-core counters.
type Buckets struct {
	counters []counter.Int64
	mask     uint32 // len(counters)-1 when that is a power of two, else 0
}

// New returns empty buckets with n counters (1 <= n <= MaxBuckets).
func New(n int) *Buckets {
	if n < 1 || n > MaxBuckets {
		panic(fmt.Sprintf("BUG: shard.New: %d buckets outside 1..%d", n, MaxBuckets))
	}
	b := &Buckets{counters: make([]counter.Int64, n)}
	if n&(n-1) == 0 {
		b.mask = uint32(n - 1)
	}
	return b
}

// Len reports the number of buckets.
func (b *Buckets) Len() int { return len(b.counters) }

func (b *Buckets) index(hint uint32) int {
	if b.mask != 0 || len(b.counters) == 1 {
		return int(hint & b.mask)
	}
	return int(hint % uint32(len(b.counters)))
}

// Take removes qty units (qty > 0), starting at the bucket picked by hint and
// moving on to its siblings. It reports whether all qty units were taken; on
// false nothing was taken. It never drives a bucket below zero.
func (b *Buckets) Take(hint uint32, qty int64) bool {
	if qty <= 0 {
		panic(fmt.Sprintf("BUG: shard.Take: qty %d <= 0", qty))
	}
	n := len(b.counters)
	start := b.index(hint)
	// First pass: one bucket that holds enough, the common case for qty 1.
	for i := 0; i < n; i++ {
		j := start + i
		if j >= n {
			j -= n
		}
		if takeFrom(&b.counters[j].Int64, qty) {
			return true
		}
	}
	if qty == 1 {
		return false
	}
	// Second pass: gather qty from several buckets, and give back if the
	// whole node does not hold enough.
	var got int64
	for i := 0; i < n && got < qty; i++ {
		j := start + i
		if j >= n {
			j -= n
		}
		got += takeUpTo(&b.counters[j].Int64, qty-got)
	}
	if got == qty {
		return true
	}
	if got > 0 {
		b.counters[start].Add(got)
	}
	return false
}

func takeFrom(c *atomic.Int64, qty int64) bool {
	for {
		v := c.Load()
		if v < qty {
			return false
		}
		if c.CompareAndSwap(v, v-qty) {
			return true
		}
	}
}

func takeUpTo(c *atomic.Int64, want int64) int64 {
	for {
		v := c.Load()
		if v <= 0 {
			return 0
		}
		n := min(v, want)
		if c.CompareAndSwap(v, v-n) {
			return n
		}
	}
}

// Put returns qty units (qty > 0) to the bucket picked by hint, for example a
// unit the ledger rejected for a reason other than stock.
func (b *Buckets) Put(hint uint32, qty int64) {
	if qty <= 0 {
		panic(fmt.Sprintf("BUG: shard.Put: qty %d <= 0", qty))
	}
	b.counters[b.index(hint)].Add(qty)
}

// Load spreads qty newly granted units (qty > 0) evenly over the buckets.
func (b *Buckets) Load(qty int64) {
	if qty <= 0 {
		panic(fmt.Sprintf("BUG: shard.Load: qty %d <= 0", qty))
	}
	n := int64(len(b.counters))
	each, rest := qty/n, qty%n
	for i := range b.counters {
		add := each
		if int64(i) < rest {
			add++
		}
		if add > 0 {
			b.counters[i].Add(add)
		}
	}
}

// TakeUpTo removes up to want units (want > 0) from the buckets, whatever
// bucket holds them, and returns how many it removed: a node giving part of
// its lease back uses it. Concurrent takes keep working.
func (b *Buckets) TakeUpTo(want int64) int64 {
	if want <= 0 {
		panic(fmt.Sprintf("BUG: shard.TakeUpTo: want %d <= 0", want))
	}
	var got int64
	for i := range b.counters {
		if got == want {
			break
		}
		got += takeUpTo(&b.counters[i].Int64, want-got)
	}
	return got
}

// Drain empties every bucket and returns the units it removed. Takes that run
// concurrently either win their unit before the drain or lose it.
func (b *Buckets) Drain() int64 {
	var total int64
	for i := range b.counters {
		total += b.counters[i].Swap(0)
	}
	return total
}

// Units returns the units held over all buckets. Under concurrent takes the
// figure is a snapshot of each bucket at a slightly different moment.
func (b *Buckets) Units() int64 {
	var total int64
	for i := range b.counters {
		total += b.counters[i].Load()
	}
	return total
}
