// Package u64map is a hash map from uint64 keys that are already hashes
// (uniformly spread) to int64 values, for an index held at a steady size
// while it turns over: the ledger's request ids at their cap, where every
// new id is an insert and every forgotten one a delete.
//
// Go's own map marks a deleted slot of a full group as a tombstone that
// later probes walk past until the table prunes them or grows, so a map
// that keeps its size while its keys turn over pays more per operation as
// it ages. This map uses linear probing with backward-shift deletion: a
// delete moves the keys after it back into the gap, no tombstone is left,
// and probe lengths depend only on how full the table is. Slots hold key
// and value side by side, so a probe that finds its key reads one cache
// line. At a million keys turned over (an insert, a delete and a miss),
// u64map_timing_test.go measured 350-410 ns against Go's map's 630-680 ns
// new and 770-1,110 ns after five turnovers, in one run.
//
// Not safe for concurrent use.
package u64map

import (
	"fmt"
	"iter"
)

// Sizes. The table doubles past loadMaxNum/loadMaxDen full: linear
// probing's expected probes for a missing key are (1 + 1/(1-a)^2)/2, 4.1
// slots (16 bytes each, four to a cache line) at 5/8. Under 1/8 full it
// shrinks to room for twice the keys left, so a map that lost most of its
// keys (an archived sale's ids) gives its memory back.
const (
	slotsMin   = 1 << 10
	loadMaxNum = 5
	loadMaxDen = 8
	loadMinDen = 8
)

type slot struct {
	key uint64 // 0: empty (key 0 itself lives in zero)
	val int64
}

// Map is a uint64 -> int64 hash map; the zero value is not usable, call
// New.
type Map struct {
	slots []slot
	mask  uint64
	n     int // keys in slots (key 0 not counted)

	hasZero bool
	zero    int64
}

// New returns an empty map with room for n keys before it grows.
func New(n int) *Map {
	m := &Map{}
	m.resize(slotsFor(n))
	return m
}

// slotsFor is the table size (a power of two) that holds n keys within
// the load bound.
func slotsFor(n int) int {
	s := slotsMin
	for s*loadMaxNum/loadMaxDen < n {
		s <<= 1
	}
	return s
}

// Len is the number of keys held.
func (m *Map) Len() int {
	if m.hasZero {
		return m.n + 1
	}
	return m.n
}

// Get returns key's value and whether the map holds key.
func (m *Map) Get(key uint64) (int64, bool) {
	if key == 0 {
		return m.zero, m.hasZero
	}
	for i := key & m.mask; ; i = (i + 1) & m.mask {
		s := &m.slots[i]
		if s.key == key {
			return s.val, true
		}
		if s.key == 0 {
			return 0, false
		}
	}
}

// Touch reads the slot where key's probe starts, and so brings its cache
// line in, and returns the key it holds (callers sum what they read into
// something they keep, so that no compiler drops the read). A caller with
// many keys to put reads all their slots first, in a loop that does little
// else: the misses then overlap, where puts one by one waited for each.
func (m *Map) Touch(key uint64) uint64 { return m.slots[key&m.mask].key }

// Put sets key's value.
func (m *Map) Put(key uint64, val int64) {
	if key == 0 {
		m.hasZero, m.zero = true, val
		return
	}
	if (m.n+1)*loadMaxDen > len(m.slots)*loadMaxNum {
		m.resize(len(m.slots) * 2)
	}
	for i := key & m.mask; ; i = (i + 1) & m.mask {
		s := &m.slots[i]
		if s.key == key {
			s.val = val
			return
		}
		if s.key == 0 {
			s.key, s.val = key, val
			m.n++
			return
		}
	}
}

// Delete removes key, if held, and reports whether it was.
func (m *Map) Delete(key uint64) bool {
	if key == 0 {
		held := m.hasZero
		m.hasZero, m.zero = false, 0
		return held
	}
	i := key & m.mask
	for m.slots[i].key != key {
		if m.slots[i].key == 0 {
			return false
		}
		i = (i + 1) & m.mask
	}
	// Backward shift: walk the run after the gap and move back into it
	// each key whose home slot does not lie between the gap and the key
	// (cyclically), so that every key stays reachable from its home
	// without passing an empty slot.
	gap := i
	for j := (i + 1) & m.mask; m.slots[j].key != 0; j = (j + 1) & m.mask {
		home := m.slots[j].key & m.mask
		if (j-home)&m.mask >= (j-gap)&m.mask {
			m.slots[gap] = m.slots[j]
			gap = j
		}
	}
	m.slots[gap] = slot{}
	m.n--
	if len(m.slots) > slotsMin && m.n*loadMinDen < len(m.slots) {
		m.resize(slotsFor(2 * m.n)) // room to grow back before it doubles again
	}
	return true
}

// All yields every key and value, in no particular order. The map must
// not change during the iteration.
func (m *Map) All() iter.Seq2[uint64, int64] {
	return func(yield func(uint64, int64) bool) {
		if m.hasZero && !yield(0, m.zero) {
			return
		}
		for _, s := range m.slots {
			if s.key != 0 && !yield(s.key, s.val) {
				return
			}
		}
	}
}

// resize moves every key into a table of size slots (a power of two).
func (m *Map) resize(size int) {
	if size&(size-1) != 0 || size < slotsMin {
		panic(fmt.Sprintf("BUG: u64map size %d is not a power of two of at least %d", size, slotsMin))
	}
	old := m.slots
	m.slots, m.mask = make([]slot, size), uint64(size-1)
	for _, s := range old {
		if s.key == 0 {
			continue
		}
		i := s.key & m.mask
		for m.slots[i].key != 0 {
			i = (i + 1) & m.mask
		}
		m.slots[i] = s
	}
}
