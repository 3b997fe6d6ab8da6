package admission

import (
	"testing"
	"time"
)

func TestAdaptiveLimit_FallsOnSlowWaitsAndClimbsBack(t *testing.T) {
	a := NewAdaptive(100*time.Millisecond, 1000)
	now := time.Unix(0, 0)
	a.now = func() time.Time { return now }
	step := func() { now = now.Add(adaptiveWindow); a.Update() }
	a.Update()
	if a.Full() || a.limit.Load() != 1000 {
		t.Fatalf("a new limit is %d, full %v", a.limit.Load(), a.Full())
	}
	// 200 deducts wait; the window's slowest answer waited too long.
	for range 200 {
		a.Enter()
	}
	a.Leave(300 * time.Millisecond)
	step()
	if got := a.limit.Load(); got != 200*3/4 {
		t.Fatalf("after a slow window the limit is %d, want %d", got, 200*3/4)
	}
	if !a.Full() {
		t.Fatal("199 waiting against a limit of 150: not full")
	}
	// Nothing answered for longer than the target while deducts wait: a
	// stall shrinks it too.
	step()
	step()
	if got := a.limit.Load(); got >= 150 {
		t.Fatalf("after a stalled window the limit is %d, want below 150", got)
	}
	// It never falls below the floor.
	for range 50 {
		step()
	}
	if got := a.limit.Load(); got != adaptiveLimitMin {
		t.Fatalf("the limit fell to %d, the floor is %d", got, adaptiveLimitMin)
	}
	// Fast answers while the path is nearly full: it climbs back, to the
	// ceiling and no further.
	for a.inPath.Load() > 0 {
		a.Leave(time.Millisecond)
	}
	for range 200 {
		for range int(a.limit.Load()) {
			a.Enter()
		}
		for a.inPath.Load() > 0 {
			a.Leave(time.Millisecond)
		}
		step()
	}
	if got := a.limit.Load(); got != 1000 {
		t.Fatalf("after fast windows the limit is %d, want the ceiling 1000", got)
	}
	// Off: never full.
	off := NewAdaptive(0, 10)
	for range 100 {
		off.Enter()
	}
	if off.Full() {
		t.Fatal("a limit that is off reports full")
	}
}

// TestAdaptiveLimit_ABurstAfterQuietIsNoStall: a node quiet for longer
// than the target gets a burst; the window closes before the first
// commit answers. That is not a stall: the clock of "nothing answered"
// starts when the path fills, not at the last answer long ago.
func TestAdaptiveLimit_ABurstAfterQuietIsNoStall(t *testing.T) {
	a := NewAdaptive(2*time.Second, 1000)
	now := time.Unix(0, 0)
	a.now = func() time.Time { return now }
	a.Update()
	a.Enter()
	a.Leave(time.Millisecond)
	now = now.Add(30 * time.Second) // quiet
	a.Update()
	for range 20 {
		a.Enter()
	}
	now = now.Add(adaptiveWindow + time.Millisecond)
	a.Update()
	if got := a.limit.Load(); got != 1000 {
		t.Fatalf("a burst after a quiet spell cut the limit to %d", got)
	}
	// A real stall still counts from the burst's start.
	now = now.Add(3 * time.Second)
	a.Update()
	if got := a.limit.Load(); got >= 1000 {
		t.Fatalf("nothing answered for 3s while 20 wait: the limit stayed %d", got)
	}
}
