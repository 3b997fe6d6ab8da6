package bench

import (
	"math/rand/v2"
	"testing"
	"time"
)

func TestLatencies_PercentilesOfKnownInputs(t *testing.T) {
	f := func(n int, want Summary) {
		t.Helper()
		l := NewLatencies(n)
		// 1..n milliseconds, shuffled: the recorder must sort.
		for _, i := range rand.Perm(n) {
			l.Record(time.Duration(i+1) * time.Millisecond)
		}
		got := l.Summarize()
		if got != want {
			t.Fatalf("n=%d: got %+v, want %+v", n, got, want)
		}
	}
	ms := time.Millisecond
	f(1, Summary{Count: 1, P50: ms, P99: ms, P999: ms, Max: ms, Mean: ms})
	f(1000, Summary{Count: 1000, P50: 500 * ms, P99: 990 * ms, P999: 999 * ms, Max: 1000 * ms, Mean: 500500 * time.Microsecond})
	f(10, Summary{Count: 10, P50: 5 * ms, P99: 10 * ms, P999: 10 * ms, Max: 10 * ms, Mean: 5500 * time.Microsecond})
	if s := NewLatencies(0).Summarize(); s != (Summary{}) {
		t.Fatalf("empty recorder: %+v", s)
	}
}

func TestLatencies_MergeKeepsEverySample(t *testing.T) {
	a, b := NewLatencies(2), NewLatencies(2)
	a.Record(3 * time.Second)
	b.Record(time.Second)
	b.Record(2 * time.Second)
	a.Merge(b)
	if s := a.Summarize(); s.Count != 3 || s.P50 != 2*time.Second || s.Max != 3*time.Second {
		t.Fatalf("merged: %+v", s)
	}
}
