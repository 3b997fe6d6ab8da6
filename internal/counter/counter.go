// Package counter holds the two pieces every hot counter in stockd is made
// of: an atomic on a cache line of its own, so that counters written from
// different cores do not share one, and the bucket a histogram counts an
// observation in. It imports nothing of ours.
package counter

import "sync/atomic"

// CacheLine is the padding unit: 128 bytes covers the adjacent-line
// prefetch of current x86 cores as well as 128-byte lines elsewhere.
const CacheLine = 128

// Uint64 is an atomic.Uint64 alone on its cache line.
type Uint64 struct {
	atomic.Uint64
	_ [CacheLine - 8]byte
}

// Int64 is an atomic.Int64 alone on its cache line.
type Int64 struct {
	atomic.Int64
	_ [CacheLine - 8]byte
}

// Bucket returns the histogram bucket v falls in: the index of the first
// upper bound v does not exceed, or len(bounds) (the +Inf bucket) when it
// exceeds them all. bounds rise.
func Bucket(bounds []float64, v float64) int {
	i := 0
	for i < len(bounds) && v > bounds[i] {
		i++
	}
	return i
}
