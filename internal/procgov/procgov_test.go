package procgov

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestPolicy_UpAfterSaturatedWindowsDownAfterQuietOnes(t *testing.T) {
	p := &Policy{Max: 4, RaiseAt: 0.95, RaiseAfter: 2, LowerAt: 0.8, LowerAfter: 3}
	step := func(procs int, cores float64, want int) {
		t.Helper()
		if got := p.Next(procs, cores); got != want {
			t.Fatalf("at %d threads, %.2f cores used: next %d, want %d", procs, cores, got, want)
		}
	}
	step(1, 0.50, 1) // one thread keeps up
	step(1, 0.94, 1)
	step(1, 0.95, 1) // saturated for one window: a burst, not yet the load
	step(1, 0.90, 1) // the count starts over
	step(1, 0.97, 1)
	step(1, 1.00, 4) // saturated for two windows: every core
	step(4, 0.90, 4) // busy
	step(4, 0.80, 4) // quiet 1
	step(4, 0.30, 4) // quiet 2
	step(4, 0.81, 4) // busy again: the count starts over
	step(4, 0.10, 4) // quiet 1
	step(4, 0.10, 4) // quiet 2
	step(4, 0.10, 1) // quiet 3: one thread
	step(1, 2.00, 1)
	step(1, 2.00, 4)
	step(4, 0.10, 4) // the quiet count of the last stay at 4 does not carry over
	one := &Policy{Max: 1, RaiseAt: 0.95, RaiseAfter: 1, LowerAt: 0.8, LowerAfter: 3}
	if got := one.Next(1, 5); got != 1 {
		t.Fatalf("a one-core machine: next %d, want 1", got)
	}
}

// TestRun_FollowsTheCPUUsed runs the governor on a CPU clock the test
// sets: busy raises it to every core within a window or two, quiet lowers
// it to one after LowerAfter windows.
func TestRun_FollowsTheCPUUsed(t *testing.T) {
	const window = 5 * time.Millisecond
	var load atomic.Int64 // cores used, in hundredths
	var mu sync.Mutex
	cpu, last := time.Duration(0), time.Now()
	cpuUsed := func() time.Duration {
		mu.Lock()
		defer mu.Unlock()
		now := time.Now()
		cpu += time.Duration(float64(now.Sub(last)) * float64(load.Load()) / 100)
		last = now
		return cpu
	}
	var procs atomic.Int64
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		run(ctx, &Policy{Max: 2, RaiseAt: 0.95, RaiseAfter: 2, LowerAt: 0.8, LowerAfter: 4}, slog.New(slog.NewTextHandler(io.Discard, nil)),
			window, cpuUsed, func(n int) { procs.Store(int64(n)) })
	}()
	waitProcs := func(want int64, what string) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for procs.Load() != want {
			if time.Now().After(deadline) {
				t.Fatalf("%s: GOMAXPROCS %d after 5 s, want %d", what, procs.Load(), want)
			}
			time.Sleep(time.Millisecond)
		}
	}
	waitProcs(1, "at start")
	load.Store(150)
	waitProcs(2, "1.5 cores used")
	load.Store(10)
	waitProcs(1, "0.1 cores used")
	cancel()
	<-done
}
