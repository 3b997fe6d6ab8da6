package engine

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
)

// TestTakeIndex_AgreesWithAMap files, finds and removes takes in a random
// order, enough of them that every stripe grows several times and shrinks
// back to empty, and checks each answer against a Go map of the same
// operations.
func TestTakeIndex_AgreesWithAMap(t *testing.T) {
	for _, by := range []takeKey{byRequest, byOrder} {
		x := newTakeIndex(by)
		model := map[string]*pendingTake{}
		rng := rand.New(rand.NewPCG(1, uint64(by)))
		var filed []*pendingTake
		take := func(key string) *pendingTake {
			p := &pendingTake{}
			if by == byRequest {
				p.reqKey = key
			} else {
				p.entry.OrderID = key
			}
			return p
		}
		for step := range 200_000 {
			key := fmt.Sprintf("k%d", rng.IntN(20_000))
			switch op := rng.IntN(10); {
			case op < 5: // file a new take, perhaps under a key in use
				p := take(key)
				got, mine := x.putIfAbsent(p)
				want, used := model[key]
				if used && (mine || got != want) || !used && (!mine || got != p) {
					t.Fatalf("step %d: putIfAbsent(%q) = %p, %v; the model holds %p, %v", step, key, got, mine, want, used)
				}
				if !used {
					model[key] = p
					filed = append(filed, p)
				}
			case op < 8: // remove a filed take, or one that lost its key
				if len(filed) == 0 {
					continue
				}
				i := rng.IntN(len(filed))
				p := filed[i]
				filed[i] = filed[len(filed)-1]
				filed = filed[:len(filed)-1]
				x.remove(p)
				delete(model, x.key(p))
				x.remove(take(x.key(p))) // never filed: a no-op
				x.remove(p)              // removed already: a no-op
			default:
				got, ok := x.get(key)
				gotBytes, okBytes := x.getBytes([]byte(key))
				want, used := model[key]
				if ok != used || got != want || okBytes != used || gotBytes != want {
					t.Fatalf("step %d: get(%q) = %p, %v and getBytes = %p, %v; the model holds %p, %v", step, key, got, ok, gotBytes, okBytes, want, used)
				}
			}
		}
		if x.len() != len(model) {
			t.Fatalf("len() = %d, the model holds %d", x.len(), len(model))
		}
		for _, p := range filed {
			x.remove(p)
		}
		if n := x.len(); n != 0 {
			t.Fatalf("after removing every take, len() = %d", n)
		}
		for key := range model {
			if _, ok := x.get(key); ok {
				t.Fatalf("%q is still found after its take was removed", key)
			}
		}
	}
}

// TestTakeIndex_ConcurrentFilers has goroutines file and remove takes of
// their own keys and race on shared ones: under -race this checks the
// locking; each shared key must end with exactly one winner filed at a
// time.
func TestTakeIndex_ConcurrentFilers(t *testing.T) {
	x := newTakeIndex(byRequest)
	var wg sync.WaitGroup
	var mu sync.Mutex
	winners := map[string]int{}
	for g := range 8 {
		wg.Go(func() {
			for i := range 5_000 {
				p := &pendingTake{reqKey: fmt.Sprintf("g%d-%d", g, i)}
				if _, mine := x.putIfAbsent(p); !mine {
					t.Errorf("%s was filed twice", p.reqKey)
					return
				}
				shared := &pendingTake{reqKey: fmt.Sprintf("shared-%d", i)}
				if _, mine := x.putIfAbsent(shared); mine {
					mu.Lock()
					winners[shared.reqKey]++
					mu.Unlock()
				}
				if got, ok := x.get(p.reqKey); !ok || got != p {
					t.Errorf("%s: get = %p, %v, want %p", p.reqKey, got, ok, p)
					return
				}
				x.remove(p)
			}
		})
	}
	wg.Wait()
	for i := range 5_000 {
		if n := winners[fmt.Sprintf("shared-%d", i)]; n != 1 {
			t.Fatalf("shared-%d was won by %d filers, want 1", i, n)
		}
	}
	if n := x.len(); n != 5_000 {
		t.Fatalf("len() = %d, want the 5000 shared keys", n)
	}
}
