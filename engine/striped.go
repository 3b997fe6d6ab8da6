package engine

import (
	"hash/maphash"
	"sync"
)

// stripeCount spreads a map over independent locks so that concurrent
// lookups of different keys rarely meet on one mutex.
const stripeCount = 64

// stripedMap is a string-keyed map split over stripeCount locked maps.
// Lookups take the key as bytes without allocating.
type stripedMap[V any] struct {
	seed    maphash.Seed
	stripes [stripeCount]struct {
		mu sync.Mutex
		m  map[string]V
		_  [40]byte // keep neighbouring stripes off one cache line
	}
}

func newStripedMap[V any]() *stripedMap[V] {
	s := &stripedMap[V]{seed: maphash.MakeSeed()}
	for i := range s.stripes {
		s.stripes[i].m = make(map[string]V)
	}
	return s
}

func (s *stripedMap[V]) getBytes(key []byte) (V, bool) {
	st := &s.stripes[maphash.Bytes(s.seed, key)%stripeCount]
	st.mu.Lock()
	v, ok := st.m[string(key)]
	st.mu.Unlock()
	return v, ok
}

func (s *stripedMap[V]) get(key string) (V, bool) {
	st := &s.stripes[maphash.String(s.seed, key)%stripeCount]
	st.mu.Lock()
	v, ok := st.m[key]
	st.mu.Unlock()
	return v, ok
}

// putIfAbsent stores v unless the key is present, and returns what the map
// holds for the key afterwards and whether that is v.
func (s *stripedMap[V]) putIfAbsent(key string, v V) (V, bool) {
	st := &s.stripes[maphash.String(s.seed, key)%stripeCount]
	st.mu.Lock()
	defer st.mu.Unlock()
	if old, ok := st.m[key]; ok {
		return old, false
	}
	st.m[key] = v
	return v, true
}

func (s *stripedMap[V]) delete(key string) {
	st := &s.stripes[maphash.String(s.seed, key)%stripeCount]
	st.mu.Lock()
	delete(st.m, key)
	st.mu.Unlock()
}

func (s *stripedMap[V]) len() int {
	n := 0
	for i := range s.stripes {
		s.stripes[i].mu.Lock()
		n += len(s.stripes[i].m)
		s.stripes[i].mu.Unlock()
	}
	return n
}
