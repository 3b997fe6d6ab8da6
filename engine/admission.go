package engine

import (
	"stockd/internal/counter"
	"time"

	"golang.org/x/time/rate"
)

// admission is the funnel's third layer: a token bucket and a cap on
// deducts in flight per node. Rejected buyers get 429 with Retry-After
// before they touch stock. The token bucket is split into shards picked by
// the deduct's sticky hint, so concurrent deducts rarely share a limiter's
// lock; each shard gets an equal part of the rate and burst.
type admission struct {
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

func newAdmission(ratePerSec float64, burst, maxInFlight int) *admission {
	a := &admission{maxInFlight: int64(maxInFlight)}
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

// admit reports whether a deduct may proceed; when it may not, retryAfter
// says when to come back. An admitted deduct must call done.
func (a *admission) admit(hint uint32, now time.Time) (ok bool, retryAfter time.Duration) {
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

// rateLimited reports whether admit reads its now argument (a rate
// limit is set); without one any now will do.
func (a *admission) rateLimited() bool { return a.shards != nil }

func (a *admission) done() {
	if a.maxInFlight > 0 {
		a.inFlight.Add(-1)
	}
}
