package engine

import (
	"hash/maphash"
	"sync"
)

// stripeCount spreads an index over independent locks so that concurrent
// lookups of different keys rarely meet on one mutex.
const stripeCount = 64

// takeIndex finds pending takes by a string key: the request key
// (byRequest) or the order id (byOrder). Each stripe is an open-addressed
// table of (hash, take) pairs, at most half full, probed linearly and
// closed up on removal (no tombstones): adding or removing a take
// allocates nothing and reads about one cache line of the table, and a
// lookup reads a take's key only where the hashes agree. Go's string maps
// did the same work at 11 % of a batch deduct's CPU: every take was added
// to two and removed from two, and each step read a map's control words
// and its key's string (a CPU profile of `scripts/bench-batch-ab.sh`'s
// load shows it).
type takeIndex struct {
	seed    maphash.Seed
	by      takeKey
	stripes [stripeCount]takeStripe
}

// takeKey names the key a takeIndex files takes under.
type takeKey int

const (
	byRequest takeKey = iota // pendingTake.reqKey
	byOrder                  // pendingTake.entry.OrderID
)

type takeSlot struct {
	hash uint64
	p    *pendingTake // nil: the slot is free
}

type takeStripe struct {
	mu    sync.Mutex
	slots []takeSlot // a power of two long
	n     int
	_     [24]byte // keep neighbouring stripes off one cache line
}

func newTakeIndex(by takeKey) *takeIndex {
	x := &takeIndex{seed: maphash.MakeSeed(), by: by}
	for i := range x.stripes {
		x.stripes[i].slots = make([]takeSlot, 16)
	}
	return x
}

func (x *takeIndex) key(p *pendingTake) string {
	if x.by == byRequest {
		return p.reqKey
	}
	return p.entry.OrderID
}

func (x *takeIndex) stripe(h uint64) *takeStripe { return &x.stripes[h%stripeCount] }

// home is the slot where a hash's probe starts (the stripe took the low
// bits).
func (st *takeStripe) home(h uint64) int { return int(h/stripeCount) & (len(st.slots) - 1) }

// find returns the slot of the take filed under key (of hash h), or of the
// free slot where its probe ended. A []byte key is compared in place, not
// copied to a string.
func find[K string | []byte](x *takeIndex, st *takeStripe, h uint64, key K) int {
	mask := len(st.slots) - 1
	i := st.home(h)
	for st.slots[i].p != nil && (st.slots[i].hash != h || x.key(st.slots[i].p) != string(key)) {
		i = (i + 1) & mask
	}
	return i
}

// getBytes returns the take filed under key, without allocating.
func (x *takeIndex) getBytes(key []byte) (*pendingTake, bool) {
	h := maphash.Bytes(x.seed, key)
	st := x.stripe(h)
	st.mu.Lock()
	p := st.slots[find(x, st, h, key)].p
	st.mu.Unlock()
	return p, p != nil
}

func (x *takeIndex) get(key string) (*pendingTake, bool) {
	h := maphash.String(x.seed, key)
	st := x.stripe(h)
	st.mu.Lock()
	p := st.slots[find(x, st, h, key)].p
	st.mu.Unlock()
	return p, p != nil
}

// putIfAbsent files p under its key unless a take is filed there, and
// returns the take filed there afterwards and whether that is p. p's key
// must not change while it is filed.
func (x *takeIndex) putIfAbsent(p *pendingTake) (*pendingTake, bool) {
	h := maphash.String(x.seed, x.key(p))
	st := x.stripe(h)
	st.mu.Lock()
	defer st.mu.Unlock()
	i := find(x, st, h, x.key(p))
	if q := st.slots[i].p; q != nil {
		return q, q == p
	}
	st.slots[i] = takeSlot{hash: h, p: p}
	st.n++
	if 2*st.n > len(st.slots) {
		st.grow()
	}
	return p, true
}

// remove takes p out of the index if it is filed there; another take
// filed under the same key stays.
func (x *takeIndex) remove(p *pendingTake) {
	h := maphash.String(x.seed, x.key(p))
	st := x.stripe(h)
	st.mu.Lock()
	defer st.mu.Unlock()
	mask := len(st.slots) - 1
	i := st.home(h)
	for st.slots[i].p != p {
		if st.slots[i].p == nil {
			return // not filed
		}
		i = (i + 1) & mask
	}
	// Close the gap: a later take of the run whose probe starts at or
	// before the gap (cyclically) moves into it, so that every probe
	// still meets its take before a free slot.
	for j := (i + 1) & mask; st.slots[j].p != nil; j = (j + 1) & mask {
		if k := st.home(st.slots[j].hash); (j-k)&mask >= (j-i)&mask {
			st.slots[i] = st.slots[j]
			i = j
		}
	}
	st.slots[i] = takeSlot{}
	st.n--
}

// grow doubles a stripe's table once it is half full, so that probes
// stay short.
func (st *takeStripe) grow() {
	old := st.slots
	st.slots = make([]takeSlot, 2*len(old))
	mask := len(st.slots) - 1
	for _, s := range old {
		if s.p == nil {
			continue
		}
		i := st.home(s.hash)
		for st.slots[i].p != nil {
			i = (i + 1) & mask
		}
		st.slots[i] = s
	}
}

func (x *takeIndex) len() int {
	n := 0
	for i := range x.stripes {
		x.stripes[i].mu.Lock()
		n += x.stripes[i].n
		x.stripes[i].mu.Unlock()
	}
	return n
}
