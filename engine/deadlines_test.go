package engine

import (
	"testing"
	"time"
)

func TestDeadlines_CloseAfterTheDurationAndShareAGrain(t *testing.T) {
	dl := newDeadlines(time.Now)
	start := time.Now()
	a := dl.after(120 * time.Millisecond)
	b := dl.after(120 * time.Millisecond)
	if a != b {
		// Two calls a few nanoseconds apart fall in one grain unless a
		// grain boundary lies between them; a third call settles it.
		if c := dl.after(120 * time.Millisecond); c != b {
			t.Fatal("deadlines in one grain do not share a channel")
		}
	}
	select {
	case <-a:
		t.Fatal("closed at once")
	default:
	}
	<-a
	if waited := time.Since(start); waited < 120*time.Millisecond {
		t.Fatalf("closed after %s, before the 120ms asked", waited)
	}
	select {
	case <-dl.after(0):
	case <-time.After(5 * time.Second):
		t.Fatal("a zero deadline did not close")
	}
}
