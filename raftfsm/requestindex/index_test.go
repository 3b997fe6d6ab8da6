package requestindex

import (
	"fmt"
	"hash/maphash"
	"testing"
)

func TestRequestIndex_SharedHashGoesToExact(t *testing.T) {
	r := New(maphash.MakeSeed(), legacyKey)
	r.Add("a", 1)
	// Another id already holds b's hash (added as add would: to the
	// filter too): b must not overwrite it.
	h := maphash.String(r.seed, "b")
	r.byHash.Put(h, 7)
	r.filter.Add(h)
	r.Add("b", 2)
	if at, ok := r.Candidate([]byte("b")); !ok || at != 2 {
		t.Fatalf("b: %d %v, want 2 from exact", at, ok)
	}
	if at, ok := r.Candidate([]byte("a")); !ok || at != 1 || r.Len() != 3 {
		t.Fatalf("a: %d %v, len %d", at, ok, r.Len())
	}
	r.Remove("b", 2)
	if at, _ := r.Candidate([]byte("b")); at != 7 {
		t.Fatalf("after removing b its hash still names the other id's record (%d), which the caller's check rejects", at)
	}
	r.Remove("a", 1)
	if _, ok := r.Candidate([]byte("a")); ok || r.Len() != 1 {
		t.Fatalf("a after removal: %v, len %d", ok, r.Len())
	}
}

// TestRequestIndex_AddAllIsAddOneByOne indexes the same ids, some sharing
// a hash with an id held before, through add one by one and through
// addAll (more than one chunk), and checks both indexes answer alike.
func TestRequestIndex_AddAllIsAddOneByOne(t *testing.T) {
	seed := maphash.MakeSeed()
	one, all := New(seed, legacyKey), New(seed, legacyKey)
	var adds []Entry
	for i := range 1000 {
		adds = append(adds, Entry{ID: fmt.Sprintf("id-%d", i), At: int64(i + 1)})
	}
	// Ten ids whose hash another record holds already: they go to exact.
	for _, r := range []*Index{one, all} {
		for _, a := range adds[:10] {
			h := maphash.String(seed, a.ID)
			r.byHash.Put(h, -1)
			r.filter.Add(h)
		}
	}
	for _, a := range adds {
		one.Add(a.ID, a.At)
	}
	all.AddAll(adds)
	if one.Len() != all.Len() || len(all.exact) != 10 {
		t.Fatalf("len %d (one by one) against %d (addAll), %d exact, want 10", one.Len(), all.Len(), len(all.exact))
	}
	for _, a := range adds {
		at, ok := all.Candidate([]byte(a.ID))
		at1, ok1 := one.Candidate([]byte(a.ID))
		if !ok || at != a.At || at != at1 || ok != ok1 {
			t.Fatalf("%s: addAll's index gives %d, %v; add's %d, %v; want %d", a.ID, at, ok, at1, ok1, a.At)
		}
	}
}

// legacyKey is the rules' test of a key held before scoped request ids,
// as the ledger passes it: here every key not starting with 0x01.
func legacyKey(key string) bool { return len(key) == 0 || key[0] != 1 }
