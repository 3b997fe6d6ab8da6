package bench

import (
	"context"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/schollz/progressbar/v3"
)

// The over-time charts: a row records its requests in up to slotsPerRun
// slots over -duration (10 ms for the default 10 s, never under 1 ms), and
// its timeline joins them into at most timelinePoints of the time it ran,
// so a row of a tenth of a second draws a line as a row of minutes does.
const (
	slotsPerRun    = 1000
	slotMin        = time.Millisecond
	timelinePoints = 100
)

// Run is one strategy's result on one scenario.
type Run struct {
	Scenario   string  `json:"scenario"`
	Strategy   string  `json:"strategy"`
	Durability string  `json:"durability"`
	Skipped    string  `json:"skipped,omitempty"`
	Sent       int     `json:"requests"` // deducts: one buyer's request each
	ElapsedSec float64 `json:"elapsed_seconds"`
	Rate       float64 `json:"requests_per_second"` // deducts a second
	// PerCall is how many deducts one HTTP request of the row carries
	// (the batch route's 100; 0 or 1: one): its latency is that
	// request's.
	PerCall    int            `json:"deducts_per_call,omitempty"`
	Latency    Summary        `json:"latency"`
	Wins       int            `json:"wins"`      // distinct orders won
	Kept       int            `json:"kept_wins"` // wins not cancelled or left to expire (holds)
	Losses     map[string]int `json:"losses"`    // by reason
	Errors     int            `json:"errors"`    // transport or server errors
	ErrorNotes []string       `json:"error_notes,omitempty"`
	Total      int64          `json:"units"`    // stock put on sale
	Final      Final          `json:"final"`    // the strategy's own count
	Oversold   int64          `json:"oversold"` // must be 0
	// The end of the sale (not for holds, where stock comes back): the
	// tail from the first sold_out answer to the last win (per SKU, the
	// longest), request ids answered both a win and a loss, and wins of
	// deducts that started after a sold_out answer of their SKU had ended.
	// Flips and late wins must be 0.
	TailMs   float64 `json:"tail_ms"`
	Flips    int     `json:"flips"`
	LateWins int     `json:"late_wins"`
	VsStockd float64 `json:"vs_stockd"` // requests/s over the stockd-commit row's
	// CPU per request sent, in µs: this process (the client side of an
	// HTTP strategy) and the server processes the harness launched (0:
	// not known).
	ClientCPUus float64 `json:"client_cpu_us_per_request"`
	ServerCPUus float64 `json:"server_cpu_us_per_request,omitempty"`
	// The order feed, read from the row's first node while it ran
	// (-feed-reader): events read, their rate, and how many the reader
	// was behind the feed's head when the row ended.
	FeedEvents int64         `json:"feed_events,omitempty"`
	FeedPerSec float64       `json:"feed_events_per_sec,omitempty"`
	FeedBehind int64         `json:"feed_behind_at_end,omitempty"`
	FeedNote   string        `json:"feed_note,omitempty"`
	Timeline   []Slot        `json:"timeline"` // throughput and latency over time
	Stock      []StockSample `json:"stock"`    // remaining stock over time
}

// Slot is one stretch of the row's timeline (the last one as much of it
// as the row lasted).
type Slot struct {
	AtSec       float64 `json:"at_seconds"`
	Seconds     float64 `json:"seconds"`
	Requests    int     `json:"requests"`
	MeanLatency float64 `json:"mean_latency_ms"`
	MaxLatency  float64 `json:"max_latency_ms"`
}

// StockSample is the remaining stock at a moment of the run.
type StockSample struct {
	AtSec     float64 `json:"at_seconds"`
	Remaining int64   `json:"remaining"`
}

// Oversold is how many units were sold beyond the stock: kept wins beyond
// the units on sale, or a final count of sold units beyond them.
func Oversold(keptWins, total, finalSold int64) int64 {
	return max(keptWins-total, finalSold-total, 0)
}

type workerStats struct {
	lat      *Latencies
	losses   map[string]int
	errors   int
	notes    []string
	won      map[string]bool // holds scenarios: each win's fate is played once
	wonIDs   []string        // other scenarios: each win's order id, deduplicated after the run
	released int             // holds cancelled, left to expire, or confirmed too late
	slots    []slotStats
	// The end of the sale: first sold_out answer per SKU, and per
	// request id its SKU, its first send, its first win and its answers.
	firstSoldOut map[int]time.Time
	answered     []answerNote // every answer, merged by buyer after the run
}

// answerNote is one answer a worker got: a slice entry while the load
// runs (no hashing), merged by buyer (a buyer has one request id) after.
type answerNote struct {
	buyer, sku int
	start, end int64 // unix nanos: no pointer for the collector to follow
	answer     uint8
}

// reqRecord is what one worker saw of one request id.
type reqRecord struct {
	sku         int
	firstStart  time.Time
	firstWinEnd time.Time // zero: no win
	answers     uint8     // answerWin | answerLoss
}

const (
	answerWin uint8 = 1 << iota
	answerLoss
)

type slotStats struct {
	n        int
	sumNanos int64
	maxNanos int64
}

// note records one answer to a request id.
// noteError counts an error, keeping the first two's text.
func (ws *workerStats) noteError(err error) {
	ws.errors++
	if len(ws.notes) < 2 {
		ws.notes = append(ws.notes, err.Error())
	}
}

func (ws *workerStats) note(r *Request, start, end time.Time, answer uint8) {
	ws.answered = append(ws.answered, answerNote{buyer: r.Buyer, sku: r.SKU, start: start.UnixNano(), end: end.UnixNano(), answer: answer})
}

// tailChecks computes the tail, flips and late wins from the workers'
// records. A request id re-sent after it won is answered with its first
// win: that is neither a late win nor part of the tail, so each request id
// counts from its first send and its first win.
func tailChecks(run *Run, stats []*workerStats) {
	first := map[int]time.Time{}
	reqs := map[int]*reqRecord{}
	for _, ws := range stats {
		for sku, t := range ws.firstSoldOut {
			if f, ok := first[sku]; !ok || t.Before(f) {
				first[sku] = t
			}
		}
		for _, n := range ws.answered {
			start, end := time.Unix(0, n.start), time.Unix(0, n.end)
			m, ok := reqs[n.buyer]
			if !ok {
				m = &reqRecord{sku: n.sku, firstStart: start}
				reqs[n.buyer] = m
			}
			m.answers |= n.answer
			if start.Before(m.firstStart) {
				m.firstStart = start
			}
			if n.answer == answerWin && (m.firstWinEnd.IsZero() || end.Before(m.firstWinEnd)) {
				m.firstWinEnd = end
			}
		}
	}
	lastWin := map[int]time.Time{}
	for _, r := range reqs {
		if r.answers == answerWin|answerLoss {
			run.Flips++
		}
		if r.firstWinEnd.IsZero() {
			continue
		}
		if r.firstWinEnd.After(lastWin[r.sku]) {
			lastWin[r.sku] = r.firstWinEnd
		}
		if f, ok := first[r.sku]; ok && r.firstStart.After(f) {
			run.LateWins++
		}
	}
	for sku, f := range first {
		if l, ok := lastWin[sku]; ok {
			run.TailMs = max(run.TailMs, float64(l.Sub(f))/1e6)
		}
	}
}

// runOne drives a strategy through a scenario: o.Conns workers take
// requests in order until all are sent or o.Duration has passed.
func runOne(ctx context.Context, st Strategy, sc *Scenario, o *Options, progress io.Writer) (*Run, error) {
	run := &Run{Scenario: sc.Name, Strategy: st.Name(), Durability: st.Durability(), Total: sc.TotalUnits(), Losses: map[string]int{}}
	if why := st.Supports(sc); why != "" {
		run.Skipped = st.Name() + " " + why
		return run, nil
	}
	if b, ok := st.(batchDeducter); ok {
		run.PerCall = b.BatchSize()
	}
	if err := st.Setup(ctx, sc); err != nil {
		return nil, fmt.Errorf("%s on %s: setup: %w", st.Name(), sc.Name, err)
	}
	slot := max(o.Duration/slotsPerRun, slotMin)
	r := &rowRun{ctx: ctx, st: st, sc: sc, run: run, start: time.Now(), slot: slot, slotsMax: int(o.Duration/slot) + 2, sampleEvery: max(o.Duration/200, 10*time.Millisecond)}
	r.stopAt = r.start.Add(o.Duration)

	// The stock-over-time sampler and the progress bar read, never write,
	// what the workers do.
	samplerDone := make(chan struct{})
	var samplerWG sync.WaitGroup
	samplerWG.Go(func() { r.sample(progress, samplerDone) })
	stats := make([]*workerStats, o.Conns)
	var wg sync.WaitGroup
	for w := 0; w < o.Conns; w++ {
		// The maps are sized for a fair share of the requests: the harness
		// should spend its CPU on the load, not on growing them.
		share := sc.Requests/o.Conns + 1
		ws := &workerStats{lat: NewLatencies(share), losses: map[string]int{}, won: map[string]bool{}, wonIDs: make([]string, 0, share),
			slots: make([]slotStats, r.slotsMax), firstSoldOut: map[int]time.Time{}, answered: make([]answerNote, 0, 2*share)}
		stats[w] = ws
		wg.Go(func() { r.work(w, ws) })
	}
	wg.Wait()
	elapsed := time.Since(r.start)
	close(samplerDone)
	samplerWG.Wait()
	won := r.merge(stats, elapsed)
	if v, ok := st.(verifier); ok && sc.HoldTTL == 0 {
		ids := make([]string, 0, len(won))
		for id := range won {
			ids = append(ids, id)
		}
		kept, unresolved, err := v.Verify(ctx, ids)
		if err != nil {
			return nil, fmt.Errorf("%s on %s: %w", st.Name(), sc.Name, err)
		}
		if unresolved > 0 {
			run.ErrorNotes = append(run.ErrorNotes, fmt.Sprintf("%d accepted orders never committed (wait=none qualifications the ledger turned down)", unresolved))
		}
		// A request id accepted on two nodes at once holds one order.
		run.Kept, run.Wins = kept, kept+unresolved
	}
	final, err := st.Final(ctx)
	if err != nil {
		return nil, fmt.Errorf("%s on %s: final count: %w", st.Name(), sc.Name, err)
	}
	run.Final = final
	run.Oversold = Oversold(int64(run.Kept), run.Total, final.Sold)
	return run, nil
}

// rowRun is one row's run: a strategy against a scenario.
type rowRun struct {
	ctx      context.Context
	st       Strategy
	sc       *Scenario
	run      *Run
	next     atomic.Int64 // the next request to send
	start    time.Time
	stopAt   time.Time
	slot     time.Duration // one slot of the workers' slotStats
	slotsMax int
	// sampleEvery is how often the stock over time is read.
	sampleEvery time.Duration
}

// sample records the stock over time and moves the progress bar (when
// progress is set) until done closes.
func (r *rowRun) sample(progress io.Writer, done <-chan struct{}) {
	var bar *progressbar.ProgressBar
	if progress != nil {
		bar = progressbar.NewOptions(r.sc.Requests, progressbar.OptionSetWriter(progress),
			progressbar.OptionSetDescription(fmt.Sprintf("%-12s %-18s", r.sc.Name, r.st.Name())),
			progressbar.OptionShowCount(), progressbar.OptionClearOnFinish(), progressbar.OptionThrottle(100*time.Millisecond))
		defer bar.Finish()
	}
	t := time.NewTicker(r.sampleEvery)
	defer t.Stop()
	sample := func() {
		if left, err := r.st.Remaining(r.ctx); err == nil {
			r.run.Stock = append(r.run.Stock, StockSample{AtSec: time.Since(r.start).Seconds(), Remaining: left})
		}
		if bar != nil {
			bar.Set(int(min(r.next.Load(), int64(r.sc.Requests))))
		}
	}
	sample()
	for {
		select {
		case <-done:
			sample()
			return
		case <-t.C:
			sample()
		}
	}
}

// over reports whether worker loops must stop before request i.
func (r *rowRun) over(i int) bool {
	return i >= r.sc.Requests || time.Now().After(r.stopAt) || r.ctx.Err() != nil
}

// work is worker w's loop: it sends requests (a batch a call if the
// strategy takes batches, each recorded with the call's latency) until
// the scenario's requests or the run's time are used up.
func (r *rowRun) work(w int, ws *workerStats) {
	if batch, ok := r.st.(batchDeducter); ok {
		k := batch.BatchSize()
		for {
			base := int(r.next.Add(int64(k)) - int64(k))
			if r.over(base) {
				return
			}
			rs := make([]Request, 0, k)
			for j := base; j < min(base+k, r.sc.Requests); j++ {
				rs = append(rs, r.sc.Request(j))
			}
			t0 := time.Now()
			outs := batch.DeductBatch(r.ctx, w, rs)
			t1 := time.Now()
			for j := range rs {
				r.record(ws, w, base+j, &rs[j], outs[j], t0, t1)
			}
		}
	}
	for {
		i := int(r.next.Add(1) - 1)
		if r.over(i) {
			return
		}
		req := r.sc.Request(i)
		t0 := time.Now()
		out := r.st.Deduct(r.ctx, w, &req)
		r.record(ws, w, i, &req, out, t0, time.Now())
	}
}

// record counts one answer of worker w: request i, sent at t0, answered
// at t1.
func (r *rowRun) record(ws *workerStats, w, i int, req *Request, out Outcome, t0, t1 time.Time) {
	d := t1.Sub(t0)
	ws.lat.Record(d)
	slot := &ws.slots[min(int(t0.Sub(r.start)/r.slot), r.slotsMax-1)]
	slot.n++
	slot.sumNanos += int64(d)
	slot.maxNanos = max(slot.maxNanos, int64(d))
	switch {
	case out.Err != nil:
		ws.noteError(out.Err)
	case out.Win:
		ws.note(req, t0, t1, answerWin)
		if r.sc.HoldTTL == 0 {
			ws.wonIDs = append(ws.wonIDs, out.OrderID)
			return
		}
		if ws.won[out.OrderID] {
			return // a re-sent request answered with its first win
		}
		ws.won[out.OrderID] = true
		kept, err := r.st.AfterWin(r.ctx, w, req, out.OrderID, r.sc.HoldFate(i))
		if !kept {
			ws.released++
		}
		if err != nil {
			ws.noteError(err)
		}
	default:
		ws.losses[out.Reason]++
		ws.note(req, t0, t1, answerLoss)
		if f, ok := ws.firstSoldOut[req.SKU]; out.Reason == "sold_out" && (!ok || t1.Before(f)) {
			ws.firstSoldOut[req.SKU] = t1
		}
	}
}

// merge adds the workers' figures into the row and returns the orders
// won.
func (r *rowRun) merge(stats []*workerStats, elapsed time.Duration) map[string]bool {
	run := r.run
	all := NewLatencies(0)
	won := map[string]bool{}
	merged := make([]slotStats, r.slotsMax)
	for _, ws := range stats {
		all.Merge(ws.lat)
		for k, v := range ws.losses {
			run.Losses[k] += v
		}
		run.Errors += ws.errors
		for _, n := range ws.notes {
			if len(run.ErrorNotes) < 3 {
				run.ErrorNotes = append(run.ErrorNotes, n)
			}
		}
		for id := range ws.won {
			won[id] = true
		}
		for _, id := range ws.wonIDs {
			won[id] = true
		}
		run.Kept -= ws.released
		for i, s := range ws.slots {
			merged[i].n += s.n
			merged[i].sumNanos += s.sumNanos
			merged[i].maxNanos = max(merged[i].maxNanos, s.maxNanos)
		}
	}
	run.Sent = all.Count()
	run.ElapsedSec = elapsed.Seconds()
	run.Rate = float64(run.Sent) / elapsed.Seconds()
	run.Latency = all.Summarize()
	run.Wins = len(won)
	run.Kept += run.Wins
	if r.sc.HoldTTL == 0 {
		tailChecks(run, stats)
	}
	run.Timeline = timeline(merged, r.slot, elapsed)
	return won
}

// timeline joins a row's slots of width slot, over the elapsed time it
// ran, into at most timelinePoints slots of its timeline.
func timeline(slots []slotStats, slot, elapsed time.Duration) []Slot {
	used := min(int((elapsed+slot-1)/slot), len(slots))
	k := max((used+timelinePoints-1)/timelinePoints, 1)
	var out []Slot
	for first := 0; first < used; first += k {
		var g slotStats
		for _, s := range slots[first:min(first+k, used)] {
			g.n += s.n
			g.sumNanos += s.sumNanos
			g.maxNanos = max(g.maxNanos, s.maxNanos)
		}
		at := time.Duration(first) * slot
		sl := Slot{AtSec: at.Seconds(), Seconds: min(time.Duration(k)*slot, elapsed-at).Seconds(), Requests: g.n, MaxLatency: float64(g.maxNanos) / 1e6}
		if g.n > 0 {
			sl.MeanLatency = float64(g.sumNanos) / float64(g.n) / 1e6
		}
		out = append(out, sl)
	}
	return out
}
