package engine

import (
	"stockd.dev/stockd/internal/deadline"
	"testing"
	"time"
)

func TestAwaitPending_StopEndsTheWaitWithOutcomeUnknown(t *testing.T) {
	e := &Engine{stop: make(chan struct{}), drainLost: make(chan struct{}), commitWaits: deadline.New(time.Now)}
	p := &pendingTake{}
	got := make(chan DeductResult)
	go func() {
		var res DeductResult
		e.awaitPending(p, false, time.Hour, &res)
		got <- res
	}()
	close(e.stop)
	e.commitWaits.End()
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
