package engine

import (
	"hash/maphash"
	"sync/atomic"
	"time"

	"stockd.dev/stockd/internal/hashfilter"
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
	// pendingFilterLog2Bits: 2 MiB per filter, two million attempts per
	// span at the filter's intended rate of false maybes. A probe reads
	// one cache line whatever the size; half a megabyte, as it was,
	// filled in two seconds of batch deducts (250,000 buyers a second),
	// and then most new ids looked like repeats, each looked up twice
	// (`TestPendingFilter_KeepsAnIDForAtLeastOneSpan` holds the span).
	pendingFilterLog2Bits = 24
	pendingFilterSpan     = 10 * time.Second
)

func newPendingFilter(now time.Time) *pendingFilter {
	f := &pendingFilter{seed: maphash.MakeSeed()}
	f.cur.Store(hashfilter.New(pendingFilterLog2Bits))
	f.prev.Store(hashfilter.New(pendingFilterLog2Bits))
	f.rotatedAt.Store(now.UnixNano())
	return f
}

// add notes a take's user and request id.
func (f *pendingFilter) add(user, requestID string) {
	f.cur.Load().Add(requestHashString(f.seed, user, requestID))
}

func (f *pendingFilter) mayContain(user, requestID []byte) bool {
	cur, prev := f.cur.Load(), f.prev.Load()
	// Once no attempt has started for two spans (a sale's tail after
	// sold out), both filters are empty: two counters read instead of two
	// cache lines of a megabyte of filters.
	if cur.Adds() == 0 && prev.Adds() == 0 {
		return false
	}
	h := requestHash(f.seed, user, requestID)
	return cur.MayContain(h) || prev.MayContain(h)
}

// prefetchLine is a word of each filter line that tells a request id new
// (hashfilter.Filter.Line): read them to bring the lines in.
type prefetchLine struct{ cur, prev, ledger *atomic.Uint64 }

// lines returns the words of the lines mayContain reads for user and
// requestID.
func (f *pendingFilter) lines(user, requestID []byte) prefetchLine {
	h := requestHash(f.seed, user, requestID)
	return prefetchLine{cur: f.cur.Load().Line(h), prev: f.prev.Load().Line(h)}
}

// requestHash is the hash of a user's request id, made without building
// their key: two pairs of one hash are told apart where it matters (the
// pending map and the batch check compare the ids themselves).
func requestHash(seed maphash.Seed, user, requestID []byte) uint64 {
	return maphash.Bytes(seed, requestID) + 0x9e3779b97f4a7c15*maphash.Bytes(seed, user)
}

// requestHashString is requestHash of ids held as strings (the same hash).
func requestHashString(seed maphash.Seed, user, requestID string) uint64 {
	return maphash.String(seed, requestID) + 0x9e3779b97f4a7c15*maphash.String(seed, user)
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
