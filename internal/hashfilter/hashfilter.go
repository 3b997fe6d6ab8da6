// Package hashfilter is a lock-free Bloom filter over 64-bit hashes: the
// deduct path asks it, with a few atomic loads and no lock, whether a
// request id or a buyer may be known before it takes the locks that say for
// sure. A "no" is always right; a "maybe" is wrong at a small rate that
// grows as the filter fills.
package hashfilter

import (
	"fmt"
	"sync/atomic"
)

// probes is the number of bits each hash sets: with a filter eight times
// as many bits as entries, four probes give about 2 % false maybes.
const probes = 4

// Filter is safe for concurrent use by any number of goroutines.
type Filter struct {
	bits []atomic.Uint64
	mask uint64
	adds atomic.Uint64
}

// New returns an empty filter of 2^log2Bits bits (log2Bits 6 to 32).
func New(log2Bits uint) *Filter {
	if log2Bits < 6 || log2Bits > 32 {
		panic(fmt.Sprintf("BUG: hashfilter.New(%d): want 6 to 32", log2Bits))
	}
	return &Filter{bits: make([]atomic.Uint64, 1<<(log2Bits-6)), mask: 1<<log2Bits - 1}
}

// Add records h.
func (f *Filter) Add(h uint64) {
	h2 := h>>32 | h<<32
	for i := uint64(0); i < probes; i++ {
		bit := (h + i*h2) & f.mask
		w := &f.bits[bit>>6]
		m := uint64(1) << (bit & 63)
		if w.Load()&m == 0 {
			w.Or(m)
		}
	}
	f.adds.Add(1)
}

// MayContain reports whether h may have been added; false is certain.
func (f *Filter) MayContain(h uint64) bool {
	h2 := h>>32 | h<<32
	for i := uint64(0); i < probes; i++ {
		bit := (h + i*h2) & f.mask
		if f.bits[bit>>6].Load()&(uint64(1)<<(bit&63)) == 0 {
			return false
		}
	}
	return true
}

// Adds is how many hashes were added (for deciding when to rebuild).
func (f *Filter) Adds() uint64 { return f.adds.Load() }

// Capacity is the number of entries the filter holds at its intended
// false-maybe rate (one per eight bits).
func (f *Filter) Capacity() uint64 { return (f.mask + 1) / 8 }
