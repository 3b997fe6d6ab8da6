package deadline

import (
	"testing"
	"time"
)

func TestDeadlines_CloseAfterTheDurationAndShareAGrain(t *testing.T) {
	dl := New(time.Now)
	start := time.Now()
	a := dl.After(120 * time.Millisecond)
	b := dl.After(120 * time.Millisecond)
	if a != b {
		// Two calls a few nanoseconds apart fall in one grain unless a
		// grain boundary lies between them; a third call settles it.
		if c := dl.After(120 * time.Millisecond); c != b {
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
	case <-dl.After(0):
	case <-time.After(5 * time.Second):
		t.Fatal("a zero deadline did not close")
	}
}

func TestDeadlines_EndClosesEveryWaitAtOnce(t *testing.T) {
	dl := New(time.Now)
	far := dl.After(time.Hour)
	near := dl.After(time.Minute)
	select {
	case <-far:
		t.Fatal("an hour's deadline closed at once")
	default:
	}
	dl.End()
	for name, ch := range map[string]<-chan struct{}{"hour": far, "minute": near, "after end": dl.After(time.Hour)} {
		select {
		case <-ch:
		default:
			t.Fatalf("the %s deadline is still open after end", name)
		}
	}
	dl.End() // a second end is harmless
}
