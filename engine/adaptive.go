package engine

import (
	"sync"
	"sync/atomic"
	"time"
)

// Admission that follows what the ledger commits (DESIGN.md,
// "Degradation"): the node counts the deducts it has won and the ledger
// has not yet answered (the commit path), and bounds them. The bound moves
// by AIMD on how long those deducts wait: when the slowest of a window
// waited longer than the target, or nothing was answered while deducts
// waited, it falls to three quarters of what was in the path; when the
// waits are short and the path was nearly full, it grows by an eighth. A
// slow disk, a lost follower or a starved CPU thus turn into fast 429s
// with Retry-After instead of queues that end in timeouts; when commits
// recover, the bound climbs back. No maintained Go library for adaptive
// limits is served to this project (the known one is refused by the
// module proxy), so this is a small one.

const (
	adaptiveLimitMin = 16
	adaptiveWindow   = 100 * time.Millisecond
	// adaptiveRetryAfter is what a buyer turned away is told.
	adaptiveRetryAfter = time.Second
)

type adaptiveLimit struct {
	target time.Duration // 0: off
	max    int64

	limit  atomic.Int64 // deducts allowed in the commit path
	inPath atomic.Int64 // deducts won and not yet answered by the ledger

	mu          sync.Mutex
	windowStart time.Time
	slowest     time.Duration // the longest wait answered in this window
	answered    int
	peak        int64 // the most in the path during this window
}

// adaptiveCeiling is the bound's ceiling when MaxInFlight sets none.
const adaptiveCeiling = 10_000

func newAdaptiveLimit(target time.Duration, maxInPath int) *adaptiveLimit {
	if maxInPath <= 0 {
		maxInPath = adaptiveCeiling
	}
	a := &adaptiveLimit{target: target, max: int64(max(maxInPath, adaptiveLimitMin))}
	a.limit.Store(a.max)
	return a
}

// full reports whether one more deduct would exceed the bound.
func (a *adaptiveLimit) full() bool {
	return a.target > 0 && a.inPath.Load() >= a.limit.Load()
}

// enter counts a deduct into the commit path.
func (a *adaptiveLimit) enter() {
	n := a.inPath.Add(1)
	a.mu.Lock()
	a.peak = max(a.peak, n)
	a.mu.Unlock()
}

// leave counts a deduct out of the path after waiting d.
func (a *adaptiveLimit) leave(d time.Duration) {
	a.inPath.Add(-1)
	a.mu.Lock()
	a.slowest = max(a.slowest, d)
	a.answered++
	a.mu.Unlock()
}

// update closes a window once adaptiveWindow has passed, and moves the
// bound.
func (a *adaptiveLimit) update(now time.Time) {
	if a.target <= 0 {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.windowStart.IsZero() {
		a.windowStart = now
		return
	}
	if now.Sub(a.windowStart) < adaptiveWindow {
		return
	}
	inPath, limit := a.inPath.Load(), a.limit.Load()
	stalled := a.answered == 0 && inPath > 0
	switch {
	case a.slowest > a.target || stalled:
		next := max(adaptiveLimitMin, min(limit, max(a.peak, inPath))*3/4)
		a.limit.Store(next)
	case a.peak >= limit*3/4 && limit < a.max:
		a.limit.Store(min(a.max, limit+max(1, limit/8)))
	}
	a.windowStart, a.slowest, a.answered, a.peak = now, 0, 0, inPath
}
