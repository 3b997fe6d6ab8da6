package control

import (
	"time"

	"stockd.dev/stockd/raftfsm/waitroom"
	"stockd.dev/stockd/stock"
)

// A ticket's ETA (docs/waiting-room.md, "The ETA"). Admissions come in
// two ways: while the tokens out are under their bound, the leader admits
// the next positions at once, a tick's worth every 50 ms; once the bound
// is reached, only admissions running out unused (or units coming back)
// let more in, so the line moves in waves an admission's ttl apart, each
// the size the bound allows then. The ETA plays those waves forward from
// the ledger as it stands: the units left, the tokens out and when the
// oldest runs out, and the share of admitted buyers who buy. Buyers buy
// within moments of their turn, so a token out for longer than
// decideWithin is taken to be one that will run out unused, and the
// share is bought over the admissions so decided; the tokens issued more
// recently are expected to buy at that share (before any is decided, all
// of them). When the units run out before the ticket there is no
// estimate. A line that moves at a steady rate for other reasons (a slow
// ledger) is covered by the measured admit rate: the ETA is the later of
// the two.

const (
	tickEvery = 50 * time.Millisecond // the leader's loop (engine/control's tick)
	wavesMax  = 1000                  // the waves played forward at most
	// decideWithin is how long after its admission a buyer is expected
	// to have bought, if at all (at most half the admission's ttl).
	decideWithin = 5 * time.Second
)

// room is what the ETA model reads of a queued sale.
type room struct {
	remaining, outstanding int64
	overadmitMilli         int64
	ttl                    time.Duration
	// frontExpiry is how long until the oldest token out runs out (0:
	// none out; a tick when already due).
	frontExpiry time.Duration
	// buyShare is the share of the admissions decided that bought;
	// pendingBuys how many of the tokens out are expected to buy yet.
	buyShare, pendingBuys float64
	perTick               int64 // admissions one tick issues at most
}

// waveETA is how long until the k-th position not yet admitted is, by
// the waves; ok false when the units run out before it.
func waveETA(r room, k int64) (time.Duration, bool) {
	var at time.Duration
	left, out, wait := float64(r.remaining)-r.pendingBuys, float64(r.outstanding)-r.pendingBuys, r.frontExpiry
	for range wavesMax {
		if left < 0.5 {
			return 0, false
		}
		if n := float64(r.overadmitMilli)*left/1000 - out; n >= 1 {
			n = float64(int64(n + 0.999))
			if float64(k) <= n {
				return at + time.Duration((k+r.perTick-1)/r.perTick)*tickEvery, true
			}
			// This wave's buyers take their units; the rest of its tokens
			// run out with the others.
			k, left = k-int64(n), left-n*r.buyShare
		}
		if wait <= 0 {
			wait = r.ttl // none were out: this wave's are the first to run out
		}
		// The tokens out run out unused, the next wave comes in.
		at, out, wait = at+wait, 0, r.ttl
	}
	return 0, false
}

// roomOf reads the model's inputs from sale row at now; frontUntil is
// the oldest unsettled admission's admitted_until (0: none), recent how
// many positions were admitted within decideWithin.
func roomOf(row *stock.SKU, now time.Time, frontUntil, recent, perTick int64) room {
	q := row.Queue
	r := room{remaining: max(row.Remaining(), 0) + row.Held, outstanding: q.Outstanding, overadmitMilli: row.Config.QueueOveradmit(),
		ttl: time.Duration(row.Config.QueueAdmitTTL()), buyShare: 1, perTick: max(perTick, 1)}
	if frontUntil > 0 {
		// Due and not yet processed: the next tick does it.
		r.frontExpiry = max(time.Unix(0, frontUntil).Sub(now), tickEvery)
	}
	undecided := min(max(recent, 0), q.Outstanding)
	if decided := q.Bought + q.Expired + q.Outstanding - undecided; decided > 0 {
		r.buyShare = float64(q.Bought) / float64(decided)
	}
	r.pendingBuys = r.buyShare * float64(undecided)
	return r
}

// TicketETA is how long until the waiting ticket at ahead+1 positions
// from the last admitted one of sale row is admitted, as this node sees
// it (0: no estimate).
func (p *Plane) TicketETA(row *stock.SKU, ahead int64) time.Duration {
	p.watchMu.Lock()
	r := p.rates[row.SKU]
	var rate float64
	var front, recent int64
	now := p.cfg.Now()
	if r != nil {
		within := min(decideWithin, time.Duration(row.Config.QueueAdmitTTL())/2)
		rate, front, recent = r.perSecond(now), r.frontUntil, r.admittedSince(now.Add(-within))
	}
	p.watchMu.Unlock()
	byWaves, ok := waveETA(roomOf(row, now, front, recent, p.admitPerTick.Load()), ahead+1)
	if !ok {
		return 0 // the units run out before this place, as things stand
	}
	if rate > 0 {
		byWaves = max(byWaves, time.Duration(float64(ahead+1)/rate*float64(time.Second)))
	}
	return byWaves
}

// frontUntil is the admitted_until of sale row's oldest admission not yet
// settled (0: none).
func (p *Plane) frontUntil(row *stock.SKU) int64 {
	q := row.Queue
	if q.ExpiredThrough >= q.AdmittedThrough {
		return 0
	}
	t, err := waitroom.AtPosition(p.ledger.QueueRecords(), row, q.ExpiredThrough+1)
	if err != nil {
		return 0
	}
	return t.AdmittedUntilUnixNano
}
