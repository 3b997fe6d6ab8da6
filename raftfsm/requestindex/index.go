// Package requestindex is the ledger's in-memory index of request ids:
// from a request id to the time of the order it produced, in about 20-40
// bytes an id, with a filter for lock-free "surely unknown" answers.
package requestindex

import (
	"hash/maphash"
	"strings"

	"stockd.dev/stockd/internal/hashfilter"
	"stockd.dev/stockd/internal/u64map"
)

// Index finds the order a request id produced without keeping the
// ids in memory: it maps a 64-bit hash of each request id to the creation
// time of its order, which with the id itself is the key of its
// requests_by_time record (whose value is the order id). A hit is
// verified by reading that record, so two ids with one hash cannot be
// confused: the second one to arrive goes to exact, keyed by the id
// itself. About 20-40 bytes per request id instead of both ids as
// strings. byHash is a u64map, not a Go map: at -request-max-keep every
// new id is an insert and a forgotten one a delete, and a Go map's
// deletes leave tombstones that make it slower as the ids turn over.
//
// Not safe for concurrent use: the Ledger guards it with its mutex.
type Index struct {
	seed   maphash.Seed
	byHash *u64map.Map      // hash(request id) -> created at (unix nanos)
	exact  map[string]int64 // request ids whose hash another id holds
	// Filter holds every hash added, for lock-free "surely not held"
	// answers; ids removed stay in it until it is rebuilt.
	filter *hashfilter.Filter
	// isLegacy says whether a key is held as the rules before scoped
	// request ids held it.
	isLegacy func(key string) bool
	// Legacy counts the keys held of the rules before scoped request ids
	// (isLegacy), or more, never fewer: while it is 0 the
	// ledger holds none, and a scoped key that is not held needs no second
	// look under its bare request id (reads, and Apply: the look would
	// find nothing on any node, so skipping it cannot make two nodes
	// differ).
	legacy int
	// prefetched sums the words addAll read ahead, so that they are read.
	prefetched uint64
}

// requestFilterLog2Bits sizes the request id filter: 2 MiB, two million
// ids at its intended rate of false maybes.
const requestFilterLog2Bits = 24

// filterLog2BitsMax bounds the filter (512 MiB would be 2^32 bits; this
// is 128 MiB, room for 64 million ids at the intended rate).
const filterLog2BitsMax = 30

// filterLog2BitsFor is the filter's size for n ids held: the default, or
// room for 2n at the intended rate.
func filterLog2BitsFor(n int) uint {
	bits := uint(requestFilterLog2Bits)
	for bits < filterLog2BitsMax && (uint64(1)<<bits)/8 < 2*uint64(n) {
		bits++
	}
	return bits
}

func New(seed maphash.Seed, isLegacy func(key string) bool) *Index {
	return &Index{seed: seed, isLegacy: isLegacy, byHash: u64map.New(0), exact: map[string]int64{},
		filter: hashfilter.New(requestFilterLog2Bits)}
}

// RebuildFilterIfFull starts the filter afresh from the ids held when
// the ids added (removed ones too) have filled it, sized for twice the ids
// held: a ledger holding more ids than the default filter takes gets a
// larger one, so a new id stays a "surely not" however many are held, and
// rebuilds stay rare (the next comes after at least as many adds again).
// The caller holds the ledger's lock; readers keep the old filter until
// they load the new one.
func (r *Index) RebuildFilterIfFull() bool {
	if r.filter.Adds() <= 2*r.filter.Capacity() {
		return false
	}
	f := hashfilter.New(filterLog2BitsFor(r.Len()))
	for h := range r.byHash.All() {
		f.Add(h)
	}
	for id := range r.exact {
		f.Add(maphash.String(r.seed, id))
	}
	r.filter = f
	return true
}

// Candidate returns the creation time under which requestID's record
// would be, if the index may hold it. The caller verifies the record.
func (r *Index) Candidate(requestID []byte) (int64, bool) {
	return candidateOf(r, maphash.Bytes(r.seed, requestID), requestID)
}

// CandidateString is candidate for a key held as a string.
func (r *Index) CandidateString(requestID string) (int64, bool) {
	return candidateOf(r, maphash.String(r.seed, requestID), requestID)
}

// candidateOf is candidate for the id requestID whose hash is h.
func candidateOf[T ~string | ~[]byte](r *Index, h uint64, requestID T) (int64, bool) {
	// The filter holds every id added (exact ones too): a new id, the
	// common case, is answered without a probe of the large map.
	if !r.filter.MayContain(h) {
		return 0, false
	}
	if len(r.exact) > 0 {
		if at, ok := r.exact[string(requestID)]; ok {
			return at, true
		}
	}
	return r.byHash.Get(h)
}

// Entry is a request id on its way into the index (addAll).
type Entry struct {
	ID string
	At int64
}

// AddAll adds request ids the ledger does not hold yet, as add would one
// by one. Each id's filter line and map slot lie at a random place, and
// a batch of takes adds hundreds: their lines are read first, a chunk at
// a time, in a loop of a few instructions each, so that the misses
// overlap, where added one by one each id waited for its own two.
func (r *Index) AddAll(adds []Entry) {
	const chunk = 64
	var hs [chunk]uint64
	for len(adds) > 0 {
		n := min(len(adds), chunk)
		for i := range n {
			hs[i] = maphash.String(r.seed, adds[i].ID)
		}
		var sum uint64
		for _, h := range hs[:n] {
			sum += r.filter.Line(h).Load() + r.byHash.Touch(h)
		}
		r.prefetched += sum
		for i := range n {
			r.addHashed(adds[i].ID, hs[i], adds[i].At)
		}
		adds = adds[n:]
	}
}

// Add records a request id the ledger does not hold yet, created at at.
func (r *Index) Add(requestID string, at int64) {
	r.addHashed(requestID, maphash.String(r.seed, requestID), at)
}

// addHashed is add of an id whose hash is h.
func (r *Index) addHashed(requestID string, h uint64, at int64) {
	if r.isLegacy(requestID) {
		r.legacy++
	}
	// A hash the filter has not seen is surely not in byHash: most are
	// new, and skip a probe of the large map (the filter's block is one
	// cache line, read once for both).
	seen := r.filter.MayContain(h)
	r.filter.Add(h)
	if seen {
		if _, taken := r.byHash.Get(h); taken {
			// A copy: the id may be a view into a larger string (a
			// decoded request group) that it would keep alive.
			r.exact[strings.Clone(requestID)] = at
			return
		}
	}
	r.byHash.Put(h, at)
}

// Remove forgets a request id the ledger holds, created at at.
func (r *Index) Remove(requestID string, at int64) {
	removed := false
	defer func() {
		if removed && r.isLegacy(requestID) && r.legacy > 0 {
			r.legacy--
		}
	}()
	if len(r.exact) > 0 {
		if _, ok := r.exact[requestID]; ok {
			delete(r.exact, requestID)
			removed = true
			return
		}
	}
	h := maphash.String(r.seed, requestID)
	if at0, ok := r.byHash.Get(h); ok && at0 == at {
		r.byHash.Delete(h) // shrinks the table once most ids are gone (an archived sale)
		removed = true
	}
}

func (r *Index) Len() int { return r.byHash.Len() + len(r.exact) }

// Filter holds the hash of every request id added, for lock-free "surely
// not held" answers; one the index rebuilt replaces it.
func (r *Index) Filter() *hashfilter.Filter { return r.filter }

// HoldsLegacy reports whether the index may hold keys of the rules before
// scoped request ids: false means it surely holds none.
func (r *Index) HoldsLegacy() bool { return r.legacy > 0 }

// Times is the creation time of every request id held, in no order.
func (r *Index) Times() []int64 {
	var times []int64
	for _, at := range r.byHash.All() {
		times = append(times, at)
	}
	for _, at := range r.exact {
		times = append(times, at)
	}
	return times
}
