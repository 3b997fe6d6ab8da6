package control

import (
	"time"

	"stockd.dev/stockd/stock"
)

// The admit rate behind a ticket's ETA (docs/waiting-room.md, "The
// ETA"): positions admitted a second over the last admitRateWindow,
// measured up to the moment of the read, so a room that stopped admitting
// shows its rate falling rather than the last burst's.

const (
	// admitRateWindow is how far back the rate looks: long enough that the
	// bursts of a leader's ticks (one every 50 ms) and of expiries average
	// out, short enough to follow a room that slows down.
	admitRateWindow = 10 * time.Second
	// admitRateStep is the spacing of the kept samples: at most
	// admitRateWindow/admitRateStep+1 a sale.
	admitRateStep = 250 * time.Millisecond
)

// admitSample is a sale's last admitted position at a moment.
type admitSample struct {
	at      time.Time
	through int64
}

// admitRate is one sale's samples, oldest first.
type admitRate struct {
	samples []admitSample
	// opened is when the last sample was appended: later notes within
	// admitRateStep of it move that sample rather than add one.
	opened time.Time
	// frontUntil is the admitted_until of the oldest admission not yet
	// settled (0: none), for the ETA.
	frontUntil int64
}

// note records that the sale admitted through position through at now.
func (r *admitRate) note(now time.Time, through int64) {
	if n := len(r.samples); n > 0 {
		last := &r.samples[n-1]
		if through == last.through {
			return
		}
		if n > 1 && now.Sub(r.opened) < admitRateStep {
			*last = admitSample{now, through}
			return
		}
	}
	r.samples, r.opened = append(r.samples, admitSample{now, through}), now
	// Keep one sample at or before the window's start as its baseline.
	drop := 0
	for drop+1 < len(r.samples) && now.Sub(r.samples[drop+1].at) >= admitRateWindow {
		drop++
	}
	r.samples = append(r.samples[:0], r.samples[drop:]...)
}

// perSecond is the rate at now: the positions admitted since the window's
// baseline over the time since it (0 before any admission).
func (r *admitRate) perSecond(now time.Time) float64 {
	if len(r.samples) < 2 {
		return 0
	}
	base := r.samples[0]
	for _, s := range r.samples[1:] {
		if now.Sub(s.at) < admitRateWindow {
			break
		}
		base = s
	}
	d := now.Sub(base.at)
	if d < admitRateStep {
		d = admitRateStep // a first tick's burst is not a rate
	}
	return float64(r.samples[len(r.samples)-1].through-base.through) / d.Seconds()
}

// admittedSince is how many positions were admitted after since, by
// the samples (the whole window's when since is before it).
func (r *admitRate) admittedSince(since time.Time) int64 {
	if len(r.samples) == 0 {
		return 0
	}
	base := r.samples[0]
	for _, s := range r.samples[1:] {
		if s.at.After(since) {
			break
		}
		base = s
	}
	return r.samples[len(r.samples)-1].through - base.through
}

// noteAdmitted records sale sku's admissions as this node applied them
// (watchMu held). The open is the rate's first sample: the positions
// admitted with it count against the time since.
func (p *Plane) noteAdmitted(row *stock.SKU) {
	q := row.Queue
	if !q.Opened() {
		return
	}
	r := p.rates[row.SKU]
	if r == nil {
		r = &admitRate{samples: []admitSample{{time.Unix(0, q.OpenedAtUnixNano), 0}}}
		p.rates[row.SKU] = r
	}
	r.note(p.cfg.Now(), q.AdmittedThrough)
	r.frontUntil = p.frontUntil(row)
}

// AdmitRate is how many positions a second sale sku admitted over the
// last admitRateWindow, as of now (0: none yet).
func (p *Plane) AdmitRate(sku string) float64 {
	p.watchMu.Lock()
	defer p.watchMu.Unlock()
	if r := p.rates[sku]; r != nil {
		return r.perSecond(p.cfg.Now())
	}
	return 0
}
