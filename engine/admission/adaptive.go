package admission

import (
	"sync"
	"sync/atomic"
	"time"
)

// Admission that follows what the ledger commits (docs/http.md, "The HTTP
// contract"): the node counts the deducts it has won and the ledger
// has not yet answered (the commit path), and bounds them. The bound moves
// by AIMD on how long those deducts wait: when the slowest of a window
// waited longer than the target on average, or nothing was answered for
// longer than the target while deducts waited, it falls to three quarters
// of what was in the path; when the
// waits are short and the path was nearly full, it grows by an eighth. A
// slow disk, a lost follower or a starved CPU thus turn into fast 429s
// with Retry-After instead of queues that end in timeouts; when commits
// recover, the bound climbs back. The signal is the window's mean wait, not
// its slowest: one slow commit in a busy cluster is not an overload. No maintained Go library for adaptive
// limits is served to this project (the known one is refused by the
// module proxy), so this is a small one.

const (
	adaptiveLimitMin = 16
	adaptiveWindow   = 100 * time.Millisecond
	// AdaptiveRetryAfter is what a buyer turned away is told.
	AdaptiveRetryAfter = time.Second
)

type Adaptive struct {
	target time.Duration // 0: off
	max    int64
	now    func() time.Time // the real clock (tests set their own)

	limit  atomic.Int64 // deducts allowed in the commit path
	inPath atomic.Int64 // deducts won and not yet answered by the ledger

	// The current window's figures, kept in atomics: enter and leave run
	// on every won deduct. update (the janitor alone) closes windows.
	waitedNanos  atomic.Int64 // the waits answered in this window, summed
	answered     atomic.Int64
	peak         atomic.Int64 // the most in the path during this window
	lastAnswered atomic.Int64 // unix nanos of the last answer, or of the path's filling from empty

	mu          sync.Mutex
	windowStart time.Time
}

// adaptiveCeiling is the bound's ceiling when MaxInFlight sets none.
const adaptiveCeiling = 10_000

func NewAdaptive(target time.Duration, maxInPath int) *Adaptive {
	if maxInPath <= 0 {
		maxInPath = adaptiveCeiling
	}
	a := &Adaptive{target: target, max: int64(max(maxInPath, adaptiveLimitMin)), now: time.Now}
	a.limit.Store(a.max)
	return a
}

// Full reports whether one more deduct would exceed the bound.
func (a *Adaptive) Full() bool {
	return a.target > 0 && a.inPath.Load() >= a.limit.Load()
}

// Enter counts a deduct into the commit path.
func (a *Adaptive) Enter() {
	n := a.inPath.Add(1)
	if n == 1 {
		// The path was empty: "nothing answered" counts from now, not
		// from the last answer of a burst long past (which made the first
		// window of every burst after a quiet spell look like a stall).
		a.lastAnswered.Store(a.now().UnixNano())
	}
	for p := a.peak.Load(); n > p && !a.peak.CompareAndSwap(p, n); p = a.peak.Load() {
	}
}

// Leave counts a deduct out of the path after waiting d.
func (a *Adaptive) Leave(d time.Duration) {
	a.inPath.Add(-1)
	a.waitedNanos.Add(int64(d))
	a.answered.Add(1)
	a.lastAnswered.Store(a.now().UnixNano())
}

// Update closes a window once adaptiveWindow has passed, and moves the
// bound.
func (a *Adaptive) Update() {
	if a.target <= 0 {
		return
	}
	now := a.now()
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.windowStart.IsZero() {
		a.windowStart = now
		a.lastAnswered.Store(now.UnixNano())
		return
	}
	if now.Sub(a.windowStart) < adaptiveWindow {
		return
	}
	inPath, limit := a.inPath.Load(), a.limit.Load()
	answered, waited, peak := a.answered.Swap(0), a.waitedNanos.Swap(0), a.peak.Swap(inPath)
	slow := answered > 0 && time.Duration(waited/answered) > a.target
	stalled := inPath > 0 && now.UnixNano()-a.lastAnswered.Load() > int64(a.target)
	switch {
	case slow || stalled:
		next := max(adaptiveLimitMin, min(limit, max(peak, inPath))*3/4)
		a.limit.Store(next)
	case peak >= limit*3/4 && limit < a.max:
		a.limit.Store(min(a.max, limit+max(1, limit/8)))
	}
	a.windowStart = now
}

// Limit is how many deducts the limit lets into the commit path now.
func (a *Adaptive) Limit() int64 { return a.limit.Load() }

// InPath is how many deducts are in the commit path.
func (a *Adaptive) InPath() int64 { return a.inPath.Load() }

// On reports whether the limit adapts at all (a target wait was set).
func (a *Adaptive) On() bool { return a.target > 0 }
