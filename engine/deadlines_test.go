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

func TestDeadlines_EndClosesEveryWaitAtOnce(t *testing.T) {
	dl := newDeadlines(time.Now)
	far := dl.after(time.Hour)
	near := dl.after(time.Minute)
	select {
	case <-far:
		t.Fatal("an hour's deadline closed at once")
	default:
	}
	dl.end()
	for name, ch := range map[string]<-chan struct{}{"hour": far, "minute": near, "after end": dl.after(time.Hour)} {
		select {
		case <-ch:
		default:
			t.Fatalf("the %s deadline is still open after end", name)
		}
	}
	dl.end() // a second end is harmless
}

func TestAwaitPending_StopEndsTheWaitWithOutcomeUnknown(t *testing.T) {
	e := &Engine{stop: make(chan struct{}), drainLost: make(chan struct{}), commitWaits: newDeadlines(time.Now)}
	p := &pendingTake{}
	got := make(chan DeductResult)
	go func() {
		var res DeductResult
		e.awaitPending(p, false, time.Hour, &res)
		got <- res
	}()
	close(e.stop)
	e.commitWaits.end()
	select {
	case res := <-got:
		if res.Status != StatusOutcomeUnknown || res.Detail == "" {
			t.Fatalf("answer after stop: %+v, want outcome_unknown with a detail", res)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("an hour's wait did not end when the engine stopped")
	}

	// A take resolved before the wait ends is answered, whatever ended it.
	p = &pendingTake{}
	p.resolve(DeductResult{Status: StatusOK})
	var res DeductResult
	e.awaitPending(p, false, time.Hour, &res)
	if res.Status != StatusOK {
		t.Fatalf("a resolved take after stop answered %v, want ok", res.Status)
	}
}
