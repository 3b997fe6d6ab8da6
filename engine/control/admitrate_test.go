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

func TestAdmitRate_AdmittedSince(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	r := &admitRate{samples: []admitSample{{t0, 0}}}
	for i := 1; i <= 40; i++ { // 10 a second for 4 s
		r.note(t0.Add(time.Duration(i)*100*time.Millisecond), int64(i))
	}
	if got := r.admittedSince(t0.Add(3 * time.Second)); got < 9 || got > 11 {
		t.Fatalf("admitted in the last second: %d, want about 10", got)
	}
	if got := r.admittedSince(t0.Add(-time.Second)); got != 40 {
		t.Fatalf("admitted since before the open: %d, want 40", got)
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

// TestWaveETA_PlaysTheWavesForward: with the bound reached, the next
// positions come in when the tokens out run out, a wave an admission's
// ttl apart, each the size the units left allow; past the units there is
// no estimate.
func TestWaveETA_PlaysTheWavesForward(t *testing.T) {
	r := room{remaining: 800, outstanding: 1200, overadmitMilli: 1200, ttl: 2 * time.Second,
		frontExpiry: 1500 * time.Millisecond, buyShare: 0.5, perTick: 10_000}
	for _, c := range []struct {
		k    int64
		want time.Duration
	}{
		{1, 1550 * time.Millisecond},    // the first wave: 960 = 1.2 × 800
		{960, 1550 * time.Millisecond},  // its last
		{961, 3550 * time.Millisecond},  // the second: 480 bought, 320 left, 384 in
		{1344, 3550 * time.Millisecond}, // its last
		{1345, 5550 * time.Millisecond},
	} {
		if got, ok := waveETA(r, c.k); !ok || got != c.want {
			t.Errorf("position %d ahead: %v %v, want %v", c.k, got, ok, c.want)
		}
	}
	if got, ok := waveETA(r, 100_000); ok {
		t.Errorf("100,000 ahead of 800 units: an ETA of %v", got)
	}
	// 600 of the 1,200 tokens out were issued a moment ago and half of
	// them will buy: 300 units fewer for the waves, 300 tokens fewer out.
	r.pendingBuys = 300
	if got, ok := waveETA(r, 600); !ok || got != 1550*time.Millisecond {
		t.Errorf("600 ahead with 300 buys pending: %v %v, want 1.55s (a first wave of 1.2 × 500)", got, ok)
	}
	if got, ok := waveETA(r, 601); !ok || got != 3550*time.Millisecond {
		t.Errorf("601 ahead with 300 buys pending: %v %v, want 3.55s", got, ok)
	}
	// Under the bound, the next positions come in with the next ticks.
	if got, ok := waveETA(room{remaining: 100, overadmitMilli: 1000, ttl: time.Minute, buyShare: 1, perTick: 10}, 25); !ok || got != 150*time.Millisecond {
		t.Errorf("25 ahead with room for 100, 10 a tick: %v %v, want 150ms", got, ok)
	}
}
