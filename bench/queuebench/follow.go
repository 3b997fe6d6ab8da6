package queuebench

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/valyala/fastjson"
)

// follower is one user with a ticket, as the buyer's page follows it.
// Its reader and its follower goroutine share it (mu).
type follower struct {
	i      int
	secret string
	pos    int64

	mu     sync.Mutex
	obs    []etaObs // the ETAs shown in line
	buying bool
	// unknown counts answers in line without an ETA.
	unknown    int
	admittedAt time.Time // from admitted_until less the admission's ttl
	// end is how the ticket ended for this follower: bought, sold_out,
	// expired, never (admitted and not used), failed.
	end   string
	endAt time.Time
	// sentAt is when the call that answered sold_out was sent.
	sentAt time.Time
}

func (f *follower) ended() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.end != ""
}

func (f *follower) finish(end string, at time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.end == "" {
		f.end, f.endAt = end, at
	}
}

type etaObs struct {
	at  time.Time
	eta time.Duration
}

// follow has every user follow their ticket from the open: cfg.Conns
// pairs of workers, each pair with every Conns-th position in line
// order. A pair's follower long-polls the first of its users not yet
// answered for good (admission goes in line order, so that is the next of
// them to be admitted) and buys once admitted; its reader reads every
// other one's ticket at the open (a page loading), and again every
// cfg.Poll (a page in line asking again), and buys for any it finds
// admitted. The Caller needs 2 × cfg.Conns connections.
func (r *run) follow(sku, runID string, secrets []string, line []int64) []*follower {
	var all []*follower
	for i, s := range secrets {
		if s != "" && line[i] > 0 {
			all = append(all, &follower{i: i, secret: s, pos: line[i]})
		}
	}
	slices.SortFunc(all, func(a, b *follower) int { return int(a.pos - b.pos) })
	w := max(r.cfg.Conns, 1)
	var wg sync.WaitGroup
	for worker := range 2 * w {
		var mine []*follower
		for k := worker % w; k < len(all); k += w {
			mine = append(mine, all[k])
		}
		if worker < w {
			wg.Go(func() {
				for _, f := range mine {
					for !f.ended() && r.step(worker, sku, runID, f) {
					}
				}
			})
			continue
		}
		wg.Go(func() {
			for {
				t0, left := time.Now(), 0
				for _, f := range mine {
					if !f.ended() {
						left++
						state, token := r.poll(worker, f, 0)
						r.act(worker, sku, runID, f, state, token)
					}
				}
				if left == 0 {
					return
				}
				time.Sleep(time.Until(t0.Add(r.cfg.Poll))) // a page asks again after its poll
			}
		})
	}
	wg.Wait()
	return all
}

// step reads f's ticket with a long-poll and acts on its state; false
// when the ticket cannot be read.
func (r *run) step(worker int, sku, runID string, f *follower) bool {
	state, token := r.poll(worker, f, r.cfg.Poll)
	return r.act(worker, sku, runID, f, state, token)
}

// act does what a buyer's page does on f's ticket in state: buys once
// admitted, unless f never buys; false when the ticket could not be read.
func (r *run) act(worker int, sku, runID string, f *follower, state, token string) bool {
	if state == "" {
		f.finish("failed", time.Now())
		return false
	}
	if state != "admitted" {
		return true
	}
	if r.neverBuys(f.i) {
		f.finish("never", time.Now())
		return true
	}
	f.mu.Lock()
	mine := f.end == "" && !f.buying
	f.buying = true
	f.mu.Unlock()
	if !mine {
		time.Sleep(10 * time.Millisecond) // bought, or buying on the pair's other worker
		return true
	}
	body := fmt.Appendf(nil, `{"user":%q,"request_id":"qb-%d","admission_token":%q}`, userName(f.i, runID), f.i, token)
	code, resp, err := r.c.Do(worker, "POST", "/v1/skus/"+sku+"/deduct", r.cfg.ServiceToken, body)
	switch {
	case err == nil && code == 200:
		f.finish("bought", time.Now())
	case err == nil && code == 409:
		// Lost to the last units: the ticket turns sold_out, or stays
		// admitted while held units may come back; ask again shortly.
		time.Sleep(100 * time.Millisecond)
	default:
		r.fail(fmt.Sprintf("buy at position %d: %d %s %v", f.pos, code, resp, err))
		f.finish("failed", time.Now())
	}
	f.mu.Lock()
	f.buying = false
	f.mu.Unlock()
	return true
}

// poll reads f's ticket, waiting up to wait for a change, and records
// what it showed; it returns the ticket's state ("" on a failure) and
// token.
func (r *run) poll(worker int, f *follower, wait time.Duration) (string, string) {
	sent := time.Now()
	ok, _, body := r.call(worker, "GET", "/v1/queue/"+f.secret+"?wait="+wait.String(), r.cfg.ServiceToken, nil, 200)
	if !ok {
		return "", ""
	}
	now := time.Now()
	v, err := fastjson.ParseBytes(body)
	if err != nil {
		r.fail(fmt.Sprintf("ticket at position %d: %v", f.pos, err))
		return "", ""
	}
	state := string(v.GetStringBytes("state"))
	f.mu.Lock()
	defer f.mu.Unlock()
	if until := string(v.GetStringBytes("admitted_until")); until != "" && f.admittedAt.IsZero() {
		if t, err := time.Parse(time.RFC3339Nano, until); err == nil {
			f.admittedAt = t.Add(-r.cfg.AdmitTTL)
		}
	}
	switch state {
	case "waiting":
		if v.GetInt64("position") > 0 {
			if eta := v.GetInt64("eta_ms"); eta > 0 {
				f.obs = append(f.obs, etaObs{now, time.Duration(eta) * time.Millisecond})
			} else {
				f.unknown++
			}
		}
	case "bought", "expired", "sold_out":
		if f.end == "" {
			f.end, f.endAt, f.sentAt = state, now, sent
		}
	}
	return state, string(v.GetStringBytes("admission_token"))
}

// summarize fills res from how the followers' tickets went.
func (r *run) summarize(res *Result, all []*follower, start time.Time) {
	var lastWin, lastAdmitted, lastEnd time.Time
	for _, f := range all {
		switch f.end {
		case "bought":
			res.Bought++
			lastWin = later(lastWin, f.endAt)
		case "sold_out":
			res.SoldOutTickets++
		case "never":
			res.NeverUsed++
		case "expired":
			res.Expired++
		}
		if !f.admittedAt.IsZero() {
			res.Admitted++
			lastAdmitted = later(lastAdmitted, f.admittedAt)
		}
		lastEnd = later(lastEnd, f.endAt)
	}
	res.LastAdmitted, res.AllAnswered = since(start, lastAdmitted), since(start, lastEnd)
	for _, f := range all {
		if f.end == "sold_out" && !lastWin.IsZero() && f.sentAt.Before(lastWin) {
			res.Told++
			res.ToldSoldOut = max(res.ToldSoldOut, f.endAt.Sub(lastWin))
		}
	}
	res.ETA = etaStats(all)
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

func since(start, t time.Time) time.Duration {
	if t.IsZero() {
		return 0
	}
	return t.Sub(start)
}

// etaStats compares each ETA shown to an admitted user with the moment
// the user was admitted.
func etaStats(all []*follower) ETAStats {
	var s ETAStats
	var errs []time.Duration
	var pairs, up int
	for _, f := range all {
		s.Unknown += f.unknown
		if f.admittedAt.IsZero() || len(f.obs) == 0 {
			continue
		}
		s.Users++
		slices.SortFunc(f.obs, func(a, b etaObs) int { return a.at.Compare(b.at) })
		wentUp := false
		for k, o := range f.obs {
			moment := o.at.Add(o.eta)
			errs = append(errs, moment.Sub(f.admittedAt).Abs())
			if k > 0 {
				pairs++
				if prev := f.obs[k-1]; moment.Sub(prev.at.Add(prev.eta)) > time.Second {
					up, wentUp = up+1, true
				}
			}
		}
		if wentUp {
			s.UsersUp++
		}
	}
	s.Shown, s.Pairs = len(errs), pairs
	if len(errs) > 0 {
		slices.Sort(errs)
		s.Median, s.P90 = errs[len(errs)/2], errs[len(errs)*9/10]
	}
	if pairs > 0 {
		s.WentUp = float64(up) / float64(pairs)
	}
	return s
}

// Write prints the runs' table and what its columns mean.
func Write(w io.Writer, cfg *Config, results []Result) {
	fmt.Fprintf(w, "\nscenario queue: %d users join a sale of %d units behind a waiting room over %d connections; at the open each reads its ticket, then buyers follow theirs (long-polls of %s, the others read again as often) and buy once admitted; %.0f%% never do (admissions last %s)\n",
		cfg.Users, cfg.Units, cfg.Conns, cfg.Poll, cfg.Never*100, cfg.AdmitTTL)
	fmt.Fprintf(w, "%-22s %9s %10s %11s %13s %13s %12s %8s %9s %11s %10s %11s %9s\n", "nodes", "joins/s", "cpu/join", "open shown",
		"last admitted", "all answered", "told after", "bought", "sold out", "cpu/bought", "plain/s", "cpu/plain", "peak RSS")
	for _, r := range results {
		rss := "-"
		if r.PeakRSS > 0 {
			rss = fmt.Sprintf("%d MiB", r.PeakRSS>>20)
		}
		fmt.Fprintf(w, "%-22s %9.0f %10s %11s %13s %13s %12s %8d %9d %11s %10.0f %11s %9s\n", r.Label, r.Joins.Rate(), r.Joins.CPUEach(),
			fmtDur(r.OpenShown), fmtDur(r.LastAdmitted), fmtDur(r.AllAnswered), fmtDur(r.ToldSoldOut), r.Bought, r.SoldOutTickets,
			r.Follow.CPUEach(), r.Plain.Rate(), r.Plain.CPUEach(), rss)
		fmt.Fprintf(w, "  tickets: %d admitted, %d bought, %d never used, %d run out, %d told sold out (%d of them by a long-poll in flight at the last sale)\n",
			r.Admitted, r.Bought, r.NeverUsed, r.Expired, r.SoldOutTickets, r.Told)
		fmt.Fprintf(w, "  told everyone sold out, each node's own figure: %s\n", strings.Join(r.NodesTold, ", "))
		fmt.Fprintf(w, "  fairness: rank correlation of join order and position %+.4f (0: arriving first bought no place)\n", r.RankCorr)
		e := r.ETA
		fmt.Fprintf(w, "  ETA: %d shown to %d admitted users: error median %s, p90 %s; went up (moved later by over 1 s) in %.1f%% of %d successive ETAs, for %d users; %d answers in line had none yet\n",
			e.Shown, e.Users, fmtDur(e.Median), fmtDur(e.P90), e.WentUp*100, e.Pairs, e.UsersUp, e.Unknown)
		if r.Failed > 0 {
			fmt.Fprintf(w, "  %d calls failed; the first: %s\n", r.Failed, r.ErrSample)
		}
	}
	for _, t := range Terms {
		fmt.Fprintf(w, "  %s: %s\n", t[0], t[1])
	}
}

// Terms explain the table's columns, in the text table and the HTML
// report alike.
var Terms = [][2]string{
	{"open shown", "from start_at until every node shows the revealed seed"},
	{"last admitted", "from start_at until the last position ever admitted was (by its token's admitted_until less the admission's ttl)"},
	{"all answered", "from start_at until every follower had its last answer: bought, sold out, run out, or admitted to a never-buyer"},
	{"told after", "from the answer to the last winning buy until the last long-poll in flight then answered sold_out"},
	{"each node's own figure", "from the ledger entry that sold the last unit until the node woke every long-poll waiting on the sale (its sold_out_told_after)"},
	{"cpu/join, cpu/bought, cpu/plain", "the launched nodes' user+system CPU, summed over them: a join; the whole follow phase (reads, long-polls, admissions, buys) over the units bought; a plain committed deduct"},
	{"ETA error", "|when the ETA shown pointed - when the position was admitted|, over every ETA shown in line to a user later admitted"},
}

// fmtDur shows d to a tenth of a millisecond, "-" for none.
func fmtDur(d time.Duration) string {
	if d <= 0 {
		return "-"
	}
	return d.Round(100 * time.Microsecond).String()
}
