package u64map

import (
	"testing"

	"pgregory.net/rapid"
)

// TestMap_BehavesAsGoMap runs random puts, deletes and gets against a Go
// map. Keys come from a small range, spread over the high bits too, so
// that they share home slots, form long runs and wrap past the table's
// end; the table grows and shrinks on the way.
func TestMap_BehavesAsGoMap(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		m := New(rapid.IntRange(0, 4000).Draw(t, "sized for"))
		want := map[uint64]int64{}
		key := rapid.Custom(func(t *rapid.T) uint64 {
			low := rapid.Uint64Range(0, 3*slotsMin).Draw(t, "low")
			high := rapid.Uint64Range(0, 3).Draw(t, "high")
			return low | high<<40
		})
		steps := rapid.IntRange(1, 6000).Draw(t, "steps")
		for range steps {
			k := key.Draw(t, "key")
			switch op := rapid.IntRange(0, 9).Draw(t, "op"); {
			case op < 5:
				v := rapid.Int64().Draw(t, "val")
				m.Put(k, v)
				want[k] = v
			case op < 8:
				_, held := want[k]
				if got := m.Delete(k); got != held {
					t.Fatalf("Delete(%#x) = %v, want %v", k, got, held)
				}
				delete(want, k)
			default:
				v, ok := m.Get(k)
				w, wok := want[k]
				if ok != wok || v != w {
					t.Fatalf("Get(%#x) = %d, %v; want %d, %v", k, v, ok, w, wok)
				}
			}
		}
		if m.Len() != len(want) {
			t.Fatalf("Len() = %d, want %d", m.Len(), len(want))
		}
		seen := 0
		for k, v := range m.All() {
			if w, ok := want[k]; !ok || w != v {
				t.Fatalf("All yields %#x=%d, want %d (held %v)", k, v, w, ok)
			}
			seen++
		}
		if seen != len(want) {
			t.Fatalf("All yields %d keys, want %d", seen, len(want))
		}
		for k, w := range want {
			if v, ok := m.Get(k); !ok || v != w {
				t.Fatalf("Get(%#x) = %d, %v after the run; want %d", k, v, ok, w)
			}
		}
	})
}

// TestMap_ShrinksWhenEmptied checks that a map that held many keys gives
// its table back once most are deleted, and grows again.
func TestMap_ShrinksWhenEmptied(t *testing.T) {
	m := New(0)
	const n = 100_000
	for k := uint64(1); k <= n; k++ {
		m.Put(k*0x9e3779b97f4a7c15, int64(k))
	}
	big := len(m.slots)
	if big*loadMaxNum/loadMaxDen < n {
		t.Fatalf("%d slots hold %d keys past the load bound", big, n)
	}
	for k := uint64(1); k <= n-100; k++ {
		if !m.Delete(k * 0x9e3779b97f4a7c15) {
			t.Fatalf("key %d not deleted", k)
		}
	}
	if len(m.slots) >= big/8 {
		t.Fatalf("%d slots after deleting down to %d keys, from %d", len(m.slots), m.Len(), big)
	}
	for k := uint64(n - 99); k <= n; k++ {
		if v, ok := m.Get(k * 0x9e3779b97f4a7c15); !ok || v != int64(k) {
			t.Fatalf("key %d lost in the shrink: %d, %v", k, v, ok)
		}
	}
}

// TestMap_TouchReadsTheProbesFirstSlot: Touch reads the slot where a key's
// probe starts, which holds the key when nothing collided with it.
func TestMap_TouchReadsTheProbesFirstSlot(t *testing.T) {
	m := New(0)
	m.Put(12345, 1)
	if got := m.Touch(12345); got != 12345 {
		t.Fatalf("Touch(12345) = %d, want the key in its first slot", got)
	}
	if got := m.Touch(99999); got != 0 {
		t.Fatalf("Touch of an empty slot = %d, want 0", got)
	}
}
