package engine

import (
	"hash/maphash"
	"sync/atomic"
	"time"

	"stockd/internal/hashfilter"
)

// pendingFilter says, without a lock, whether a request id may have an
// attempt pending on this node: every attempt adds its id before it
// registers. It is two filters, the current one taking adds; every
// pendingFilterSpan the older is dropped, so the filter never fills. An
// attempt older than two spans may be missed: its repeat then meets it at
// registration instead, which shares its answer all the same.
type pendingFilter struct {
	seed      maphash.Seed
	cur, prev atomic.Pointer[hashfilter.Filter]
	rotatedAt atomic.Int64
}

const (
	// pendingFilterLog2Bits: 512 KiB per filter, half a million attempts
	// per span at the filter's intended rate of false maybes.
	pendingFilterLog2Bits = 22
	pendingFilterSpan     = 10 * time.Second
)

func newPendingFilter(now time.Time) *pendingFilter {
	f := &pendingFilter{seed: maphash.MakeSeed()}
	f.cur.Store(hashfilter.New(pendingFilterLog2Bits))
	f.prev.Store(hashfilter.New(pendingFilterLog2Bits))
	f.rotatedAt.Store(now.UnixNano())
	return f
}

// add notes key, a take's request key (pendingTake.reqKey).
func (f *pendingFilter) add(key string) {
	f.cur.Load().Add(maphash.String(f.seed, key))
}

func (f *pendingFilter) mayContain(requestID []byte) bool {
	h := maphash.Bytes(f.seed, requestID)
	return f.cur.Load().MayContain(h) || f.prev.Load().MayContain(h)
}

// rotate starts a new span when the current one is over. The janitor
// calls it; concurrent adds land in one of the two live filters.
func (f *pendingFilter) rotate(now time.Time) {
	if now.UnixNano()-f.rotatedAt.Load() < int64(pendingFilterSpan) {
		return
	}
	f.rotatedAt.Store(now.UnixNano())
	f.prev.Store(f.cur.Load())
	f.cur.Store(hashfilter.New(pendingFilterLog2Bits))
}
