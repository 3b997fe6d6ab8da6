package orderid

import (
	"sync"
	"testing"
)

func TestMinter_IDsParseBackAndNeverRepeat(t *testing.T) {
	m := NewMinter("n-1", 41)
	seen := map[string]bool{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 1000 {
				id := m.Next()
				mu.Lock()
				if seen[id] {
					t.Errorf("%s minted twice", id)
				}
				seen[id] = true
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	for id := range seen {
		p, ok := Parse(id)
		r, rok := p.RandomNumber()
		if !ok || !rok || p.Node != "n-1" || p.Seq <= 41 || p.Seq > 4041 || !p.CanonicalSeq() || Format(p.Node, p.Seq, r) != id || Owner(id) != "n-1" {
			t.Fatalf("%s parses as %+v (%v), random %d (%v)", id, p, ok, r, rok)
		}
	}
}

func TestParse_OtherShapes(t *testing.T) {
	for _, id := range []string{"", "o1", "a-b", "-1-x", "n1--x", "n1-1-", "n1-!-x"} {
		if p, ok := Parse(id); ok {
			t.Errorf("%q parsed as %+v", id, p)
		}
		if Owner(id) != "" {
			t.Errorf("%q has an owner", id)
		}
	}
	// Shaped, but not as Minter writes: a leading zero, an upper case
	// random part.
	p, ok := Parse("n1-0a-X")
	if !ok || p.CanonicalSeq() || p.Seq != 10 {
		t.Fatalf("n1-0a-X: %+v %v", p, ok)
	}
	if _, ok := p.RandomNumber(); ok {
		t.Fatal("X is not a random part Minter writes")
	}
}

func TestOwner_IsThePrefixBeforeSequenceAndRandom(t *testing.T) {
	f := func(id, want string) {
		t.Helper()
		if got := Owner(id); got != want {
			t.Fatalf("Owner(%q) = %q, want %q", id, got, want)
		}
	}
	f("n1-homk32wr1h-3k9x0a", "n1")
	f("node-a-1a-zz", "node-a")
	f("n1-1", "")
	f("plain", "")
}
