// Package admission is the deduct funnel's gates before stock: a token
// bucket with a cap on deducts in flight (Gate), and an in-path limit that
// adapts to how long admitted deducts wait (Adaptive).
package admission

import (
	"stockd.dev/stockd/internal/counter"
	"time"

	"golang.org/x/time/rate"
)

// Gate is the funnel's third layer: a token bucket and a cap on
// deducts in flight per node. Rejected buyers get 429 with Retry-After
// before they touch stock. The token bucket is split into shards picked by
// the deduct's sticky hint, so concurrent deducts rarely share a limiter's
// lock; each shard gets an equal part of the rate and burst.
type Gate struct {
	shards      []paddedLimiter
	tokenEvery  time.Duration // one shard's refill interval: the retry hint
	inFlight    counter.Int64
	maxInFlight int64 // 0: no cap
}

type paddedLimiter struct {
	lim *rate.Limiter
	_   [counter.CacheLine - 8]byte
}

// admissionShards spreads the token bucket; a power of two for the mask.
const admissionShards = 8

func NewGate(ratePerSec float64, burst, maxInFlight int) *Gate {
	a := &Gate{maxInFlight: int64(maxInFlight)}
	if ratePerSec > 0 {
		a.shards = make([]paddedLimiter, admissionShards)
		a.tokenEvery = time.Duration(float64(time.Second) * admissionShards / ratePerSec)
		shardBurst := max(1, burst/admissionShards)
		for i := range a.shards {
			a.shards[i].lim = rate.NewLimiter(rate.Limit(ratePerSec/admissionShards), shardBurst)
		}
	}
	return a
}

// Admit reports whether a deduct may proceed; when it may not, retryAfter
// says when to come back. An admitted deduct must call done.
func (a *Gate) Admit(hint uint32, now time.Time) (ok bool, retryAfter time.Duration) {
	if a.maxInFlight > 0 && a.inFlight.Add(1) > a.maxInFlight {
		a.inFlight.Add(-1)
		return false, time.Second
	}
	// AllowN, unlike Reserve, does not allocate.
	if a.shards != nil && !a.shards[hint&(admissionShards-1)].lim.AllowN(now, 1) {
		if a.maxInFlight > 0 {
			a.inFlight.Add(-1)
		}
		return false, a.tokenEvery
	}
	return true, 0
}

// RateLimited reports whether admit reads its now argument (a rate
// limit is set); without one any now will do.
func (a *Gate) RateLimited() bool { return a.shards != nil }

func (a *Gate) Done() {
	if a.maxInFlight > 0 {
		a.inFlight.Add(-1)
	}
}

// InFlight is the deducts admitted and not yet done.
func (a *Gate) InFlight() int64 { return a.inFlight.Load() }
