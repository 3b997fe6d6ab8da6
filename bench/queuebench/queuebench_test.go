package queuebench

import (
	"testing"
	"time"
)

func TestETAStats_ErrorAndWentUp(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	all := []*follower{
		// Shown 2 s at 0 (pointing at 2 s), then 3 s at 1 s (4 s: moved
		// 2 s later), admitted at 4 s: errors 2 s and 0.
		{admittedAt: at(4000), obs: []etaObs{{at(0), 2 * time.Second}, {at(1000), 3 * time.Second}}},
		// Shown 1 s at 0, 0.5 s at 0.5 s (the same moment), admitted at
		// 1.1 s: errors 100 ms twice; never went up.
		{admittedAt: at(1100), obs: []etaObs{{at(0), time.Second}, {at(500), 500 * time.Millisecond}}, unknown: 2},
		// Never admitted: its ETAs count for nothing but the unknown ones.
		{obs: []etaObs{{at(0), time.Second}}, unknown: 1},
	}
	s := etaStats(all)
	if s.Users != 2 || s.Shown != 4 || s.Unknown != 3 {
		t.Fatalf("counted %+v", s)
	}
	if s.Median != 100*time.Millisecond || s.P90 != 2*time.Second {
		t.Fatalf("errors: median %v p90 %v, want 100ms and 2s", s.Median, s.P90)
	}
	if s.WentUp != 0.5 || s.Pairs != 2 || s.UsersUp != 1 {
		t.Fatalf("went up in %.2f of %d successive ETAs for %d users, want 0.5 of 2 for 1", s.WentUp, s.Pairs, s.UsersUp)
	}
}

func TestNeverBuys_TheShareAsked(t *testing.T) {
	for _, share := range []float64{0, 0.1, 0.5} {
		r := &run{cfg: &Config{Never: share}}
		n := 0
		for i := range 10_000 {
			if r.neverBuys(i) {
				n++
			}
		}
		if want := int(share * 10_000); n != want {
			t.Errorf("share %.1f: %d of 10,000 never buy, want %d", share, n, want)
		}
	}
}
