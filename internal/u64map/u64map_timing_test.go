package u64map

import (
	"math/rand/v2"
	"testing"
)

// churnHeld is the keys held while a benchmark turns them over: the
// ledger's default cap of request ids.
const churnHeld = 1_000_000

// churner is the index under test: Put, Delete and Get of one map kind.
type churner interface {
	put(k uint64, v int64)
	del(k uint64)
	get(k uint64) bool
}

type goMap map[uint64]int64

func (m goMap) put(k uint64, v int64) { m[k] = v }
func (m goMap) del(k uint64)          { delete(m, k) }
func (m goMap) get(k uint64) bool     { _, ok := m[k]; return ok }

type ours struct{ *Map }

func (m ours) put(k uint64, v int64) { m.Put(k, v) }
func (m ours) del(k uint64)          { m.Delete(k) }
func (m ours) get(k uint64) bool     { _, ok := m.Get(k); return ok }

// benchChurn holds churnHeld keys and, per op, inserts a new key, deletes
// the oldest and looks up a key it does not hold: the request index at
// its cap. aged turns the keys over that many times before the timer
// starts.
func benchChurn(b *testing.B, m churner, aged int) {
	r := rand.New(rand.NewPCG(1, 2))
	ring := make([]uint64, churnHeld)
	for i := range ring {
		ring[i] = r.Uint64()
		m.put(ring[i], int64(i))
	}
	pos := 0
	step := func() {
		k := r.Uint64()
		m.del(ring[pos])
		ring[pos] = k
		m.put(k, int64(pos))
		if m.get(r.Uint64()) {
			b.Fatal("a random key was found")
		}
		if pos++; pos == churnHeld {
			pos = 0
		}
	}
	for range aged * churnHeld {
		step()
	}
	b.ResetTimer()
	for range b.N {
		step()
	}
}

// BenchmarkChurn_* compare Go's map (the baseline) with this one, new
// and after the million keys turned over five times.
func BenchmarkChurn_GoMapNew(b *testing.B)  { benchChurn(b, goMap{}, 0) }
func BenchmarkChurn_GoMapAged(b *testing.B) { benchChurn(b, goMap{}, 5) }
func BenchmarkChurn_New(b *testing.B)       { benchChurn(b, ours{New(0)}, 0) }
func BenchmarkChurn_Aged(b *testing.B)      { benchChurn(b, ours{New(0)}, 5) }
