package control

import (
	"math"
	"testing"
	"time"
)

func TestAdmitRate_FollowsTheRoomAndFallsWhenItStops(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	r := &admitRate{samples: []admitSample{{t0, 0}}}
	// 100 positions a second for 20 s, a tick every 50 ms.
	for i := 1; i <= 400; i++ {
		r.note(t0.Add(time.Duration(i)*50*time.Millisecond), int64(i*5))
	}
	end := t0.Add(20 * time.Second)
	if got := r.perSecond(end); math.Abs(got-100) > 3 {
		t.Fatalf("steady room: %.1f/s, want 100", got)
	}
	if n := len(r.samples); n > int(admitRateWindow/admitRateStep)+2 {
		t.Fatalf("kept %d samples, want at most %d", n, int(admitRateWindow/admitRateStep)+2)
	}
	// Stopped for 5 s: half the window admitted nothing.
	if got := r.perSecond(end.Add(5 * time.Second)); math.Abs(got-50) > 3 {
		t.Fatalf("five seconds after it stopped: %.1f/s, want about 50", got)
	}
	if got := r.perSecond(end.Add(time.Minute)); got != 0 {
		t.Fatalf("a minute after it stopped: %.1f/s, want 0", got)
	}
	// A repeat of the same position adds no sample.
	n := len(r.samples)
	r.note(end.Add(time.Second), 2000)
	if len(r.samples) != n {
		t.Fatalf("an unchanged position added a sample")
	}
}

func TestAdmitRate_AFirstBurstIsNoRate(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	r := &admitRate{samples: []admitSample{{t0, 0}}}
	r.note(t0.Add(time.Millisecond), 64)
	if got := r.perSecond(t0.Add(2 * time.Millisecond)); got > 64/admitRateStep.Seconds() {
		t.Fatalf("one tick's burst reads %.0f/s", got)
	}
	if got := (&admitRate{}).perSecond(t0); got != 0 {
		t.Fatalf("no samples: %.1f/s", got)
	}
}
