// Package hashfilter is a lock-free Bloom filter over 64-bit hashes: the
// deduct path asks it, with a few atomic loads and no lock, whether a
// request id or a buyer may be known before it takes the locks that say for
// sure. A "no" is always right; a "maybe" is wrong at a small rate that
// grows as the filter fills.
package hashfilter

import (
	"fmt"
	"os"
	"sync/atomic"
)

// probes is the number of bits each hash sets. A hash picks one block of
// 512 bits, a cache line, and sets its bits there: a question costs one
// cache miss, not one per probe, at a false-maybe rate close to a plain
// Bloom filter's (about 2.5 % with eight bits an entry).
const (
	probes     = 4
	blockWords = 8 // 512 bits
	blockBits  = blockWords * 64
)

// Filter is safe for concurrent use by any number of goroutines.
type Filter struct {
	bits      []atomic.Uint64
	blockMask uint64
	mask      uint64 // bits - 1
	adds      atomic.Uint64
}

// New returns an empty filter of 2^log2Bits bits (log2Bits 9 to 32).
func New(log2Bits uint) *Filter {
	if log2Bits < 9 || log2Bits > 32 {
		panic(fmt.Sprintf("BUG: hashfilter.New(%d): want 9 to 32", log2Bits))
	}
	f := &Filter{bits: make([]atomic.Uint64, 1<<(log2Bits-6)), blockMask: 1<<(log2Bits-9) - 1, mask: 1<<log2Bits - 1}
	f.touch()
	return f
}

// touch writes one word of every page of the filter's bits. Memory fresh
// from the kernel is not written by Go's allocator: until a page is
// written, reading it reads the kernel's shared zero page, and questions
// asked of an empty filter, which a sale's tail asks on every sold-out
// answer, read such pages. On the virtual machines we measure on, that
// cost a new node's sold-out answer 25-37 µs of CPU against 16-23 µs with the
// pages written (`scripts/bench-ab.sh -w soldout` on a fresh node): the price of
// writing them is one page fault each, once, when the filter is made.
func (f *Filter) touch() {
	step := os.Getpagesize() / 8
	for i := 0; i < len(f.bits); i += step {
		f.bits[i].Store(0)
	}
}

// block is h's block; h's low bits choose it, its bits above 23 (clear of
// any block number) choose the bits in it.
func (f *Filter) block(h uint64) []atomic.Uint64 {
	b := (h & f.blockMask) * blockWords
	return f.bits[b : b+blockWords : b+blockWords]
}

// Add records h.
func (f *Filter) Add(h uint64) {
	blk, x := f.block(h), h>>23
	for range probes {
		bit := x % blockBits
		x /= blockBits
		w := &blk[bit>>6]
		m := uint64(1) << (bit & 63)
		if w.Load()&m == 0 {
			w.Or(m)
		}
	}
	f.adds.Add(1)
}

// MayContain reports whether h may have been added; false is certain.
func (f *Filter) MayContain(h uint64) bool {
	blk, x := f.block(h), h>>23
	for range probes {
		bit := x % blockBits
		x /= blockBits
		if blk[bit>>6].Load()&(uint64(1)<<(bit&63)) == 0 {
			return false
		}
	}
	return true
}

// Line returns the first word of h's block: reading it brings in the cache
// line that MayContain(h) reads. A caller with many questions to ask, such
// as a batch of a hundred buyers, reads all their lines first, in a loop
// that does little else (and sums the words into something it keeps, so
// that no compiler drops the reads): the reads then overlap, where the
// questions, each behind the work of the one before, waited for one miss
// at a time.
func (f *Filter) Line(h uint64) *atomic.Uint64 { return &f.block(h)[0] }

// Adds is how many hashes were added (for deciding when to rebuild).
func (f *Filter) Adds() uint64 { return f.adds.Load() }

// Capacity is the number of entries the filter holds at its intended
// false-maybe rate (one per eight bits).
func (f *Filter) Capacity() uint64 { return (f.mask + 1) / 8 }
