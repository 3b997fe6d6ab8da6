// Package procgov sets how many threads run a process's Go code at once
// (GOMAXPROCS) from the CPU the process uses: one while one thread keeps
// up, every core once it does not.
//
// On cores shared with other busy processes (the load client, other
// nodes on a small host) a node spends less CPU a request on one thread:
// its goroutines hand work to each other without waking a second thread
// that then looks for work, and Go's monitor thread naps less. Under load
// that one thread cannot carry, every core serves. The governor moves up
// soon (two windows of a saturated thread) and down slowly (seconds well
// under one core), so a sale's first burst waits about 200 ms for the
// cores, a moment's burst does not move it, and a lull does not flap the
// setting.
package procgov

import (
	"context"
	"log/slog"
	"runtime"
	"time"

	"stockd.dev/stockd/internal/procstat"
)

// Defaults: the window over which CPU use is read, the share of one core
// at one thread that calls for every core, the share of one core at
// every core under which one thread would do, and how long that must
// last.
const (
	Window     = 100 * time.Millisecond
	RaiseAt    = 0.95
	RaiseAfter = 2 * Window
	LowerAt    = 0.8
	LowerAfter = 3 * time.Second
)

// Policy decides the next setting from the cores the process used over
// the last window. It keeps the count of quiet windows, so use one per
// governor.
type Policy struct {
	Max        int     // the most threads: the machine's cores, or Go's own choice
	RaiseAt    float64 // cores used at one thread at or above which, for RaiseAfter windows in a row, Max threads run
	RaiseAfter int     // windows
	LowerAt    float64 // cores used at Max threads at or below which, for LowerAfter windows in a row, one runs
	LowerAfter int     // windows
	busy       int     // windows in a row at or above RaiseAt, at one thread
	quiet      int     // windows in a row at or below LowerAt, at Max
}

// DefaultPolicy is the policy stockd serve runs with max threads at most.
func DefaultPolicy(max int) *Policy {
	return &Policy{Max: max, RaiseAt: RaiseAt, RaiseAfter: int(RaiseAfter / Window), LowerAt: LowerAt, LowerAfter: int(LowerAfter / Window)}
}

// Next returns the setting for the next window, given the current one
// and the cores used (CPU time over wall time) in the last.
func (p *Policy) Next(procs int, cores float64) int {
	if p.Max <= 1 {
		return 1
	}
	if procs <= 1 {
		p.quiet = 0
		if cores < p.RaiseAt {
			p.busy = 0
			return 1
		}
		if p.busy++; p.busy < p.RaiseAfter {
			return 1
		}
		p.busy = 0
		return p.Max
	}
	p.busy = 0
	if cores > p.LowerAt {
		p.quiet = 0
		return procs
	}
	p.quiet++
	if p.quiet < p.LowerAfter {
		return procs
	}
	p.quiet = 0
	return 1
}

// Run governs this process's GOMAXPROCS by p every Window until ctx
// ends, starting at one thread, and logs each change. It returns when
// ctx ends, leaving the setting where it was.
func Run(ctx context.Context, p *Policy, logger *slog.Logger) {
	run(ctx, p, logger, Window, procstat.Self, func(n int) { runtime.GOMAXPROCS(n) })
}

// run is Run on a given window, CPU clock and setter.
func run(ctx context.Context, p *Policy, logger *slog.Logger, window time.Duration, cpuUsed func() time.Duration, set func(int)) {
	procs := 1
	set(procs)
	tick := time.NewTicker(window)
	defer tick.Stop()
	lastCPU, lastAt := cpuUsed(), time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			cpu := cpuUsed()
			cores := float64(cpu-lastCPU) / float64(now.Sub(lastAt))
			lastCPU, lastAt = cpu, now
			if next := p.Next(procs, cores); next != procs {
				set(next)
				logger.Info("threads running Go code changed", "procs", next, "was", procs, "cores_used", round2(cores))
				procs = next
			}
		}
	}
}

func round2(f float64) float64 { return float64(int(f*100+0.5)) / 100 }
