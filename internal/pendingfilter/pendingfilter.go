// Package pendingfilter says, without a lock, whether a user's request id
// may have an attempt pending on this node (the engine's first check of a
// repeat).
package pendingfilter

import (
	"hash/maphash"
	"sync/atomic"
	"time"

	"stockd.dev/stockd/internal/hashfilter"
)

// Filter says, without a lock, whether a request id may have an attempt
// pending on this node: every attempt adds its id before it registers. It is two filters, the current one taking adds; every
// Span the older is dropped, so the filter never fills. An
// attempt older than two spans may be missed: its repeat then meets it at
// registration instead, which shares its answer all the same.
type Filter struct {
	seed      maphash.Seed
	cur, prev atomic.Pointer[hashfilter.Filter]
	rotatedAt atomic.Int64
}

const (
	// log2Bits: 2 MiB per filter, two million attempts per
	// span at the filter's intended rate of false maybes. A probe reads
	// one cache line whatever the size; half a megabyte, as it was,
	// filled in two seconds of batch deducts (250,000 buyers a second),
	// and then most new ids looked like repeats, each looked up twice
	// (`TestPendingFilter_KeepsAnIDForAtLeastOneSpan` holds the span).
	log2Bits = 24
	Span     = 10 * time.Second
)

// New is an empty filter whose first span starts at now.
func New(now time.Time) *Filter {
	f := &Filter{seed: maphash.MakeSeed()}
	f.cur.Store(hashfilter.New(log2Bits))
	f.prev.Store(hashfilter.New(log2Bits))
	f.rotatedAt.Store(now.UnixNano())
	return f
}

// Add notes a take's user and request id.
func (f *Filter) Add(user, requestID string) {
	f.cur.Load().Add(requestHashString(f.seed, user, requestID))
}

// MayContain reports whether user's requestID may have been added in the
// last two spans (false: surely not).
func (f *Filter) MayContain(user, requestID []byte) bool {
	cur, prev := f.cur.Load(), f.prev.Load()
	// Once no attempt has started for two spans (a sale's tail after
	// sold out), both filters are empty: two counters read instead of two
	// cache lines of a megabyte of filters.
	if cur.Adds() == 0 && prev.Adds() == 0 {
		return false
	}
	h := RequestHash(f.seed, user, requestID)
	return cur.MayContain(h) || prev.MayContain(h)
}

// Lines are a word of each filter line that tells a request id new
// (hashfilter.Filter.Line), and of the ledger's: read them to bring the
// lines in.
type Lines struct{ Cur, Prev, Ledger *atomic.Uint64 }

// Lines returns the words of the lines MayContain reads for user and
// requestID (Ledger is the caller's to set).
func (f *Filter) Lines(user, requestID []byte) Lines {
	h := RequestHash(f.seed, user, requestID)
	return Lines{Cur: f.cur.Load().Line(h), Prev: f.prev.Load().Line(h)}
}

// RequestHash is the hash of a user's request id, made without building
// their key: two pairs of one hash are told apart where it matters (the
// pending map and the batch check compare the ids themselves).
func RequestHash(seed maphash.Seed, user, requestID []byte) uint64 {
	return maphash.Bytes(seed, requestID) + 0x9e3779b97f4a7c15*maphash.Bytes(seed, user)
}

// requestHashString is RequestHash of ids held as strings (the same hash).
func requestHashString(seed maphash.Seed, user, requestID string) uint64 {
	return maphash.String(seed, requestID) + 0x9e3779b97f4a7c15*maphash.String(seed, user)
}

// Rotate starts a new span when the current one is over. The engine's
// janitor calls it; concurrent adds land in one of the two live filters.
func (f *Filter) Rotate(now time.Time) {
	if now.UnixNano()-f.rotatedAt.Load() < int64(Span) {
		return
	}
	f.rotatedAt.Store(now.UnixNano())
	f.prev.Store(f.cur.Load())
	f.cur.Store(hashfilter.New(log2Bits))
}
