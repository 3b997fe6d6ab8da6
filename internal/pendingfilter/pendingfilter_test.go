package pendingfilter

import (
	"fmt"
	"testing"
	"time"
)

// TestPendingFilter_KeepsAnIDForAtLeastOneSpan: an attempt's id is found
// while it is in the current filter and after one rotation, and gone after
// two; ids never added are not found, empty filters or not.
func TestPendingFilter_KeepsAnIDForAtLeastOneSpan(t *testing.T) {
	start := time.Unix(1_800_000_000, 0)
	f := New(start)
	has := func(user, id string) bool { return f.MayContain([]byte(user), []byte(id)) }
	if has("alice", "r1") {
		t.Fatal("an empty filter holds alice's r1")
	}
	f.Add("alice", "r1")
	if !has("alice", "r1") {
		t.Fatal("alice's r1 not found right after it was added")
	}
	if has("bob", "r1") {
		t.Fatal("bob's r1 found: the filter mixed two users' ids (or a rare false maybe; the hash is seeded)")
	}
	f.Rotate(start.Add(Span / 2))
	if !has("alice", "r1") {
		t.Fatal("a rotation before the span ended dropped alice's r1")
	}
	f.Rotate(start.Add(Span))
	if !has("alice", "r1") {
		t.Fatal("alice's r1 gone after one rotation; it must last one more span")
	}
	f.Rotate(start.Add(2 * Span))
	if has("alice", "r1") {
		t.Fatal("alice's r1 still held after two rotations")
	}
	// Many ids, the last of them kept: none lost among the others.
	for i := range 10_000 {
		f.Add(fmt.Sprint("u", i), "r")
	}
	for i := range 10_000 {
		if !has(fmt.Sprint("u", i), "r") {
			t.Fatalf("u%d's id lost among 10,000", i)
		}
	}
}
