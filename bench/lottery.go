package bench

import (
	"context"
	"fmt"
	"io"
	"slices"
	"stockd.dev/stockd/bench/queuebench"
	"stockd.dev/stockd/internal/procstat"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fastjson"
)

// The lottery scenario: -requests entrants enter one lottery sale of
// -units over -conns connections (spread over the nodes), as fast as the
// nodes answer, while its entries are open (-duration); then the leader
// draws at entries_close_at and the harness times how long after the close
// the draw is readable. It reports entries per second and the draw's time.

const lotteryScenario = "lottery"

const (
	lotteryDrawWaitMax = 5 * time.Minute // the draw of 10 million entries fits
	lotteryRetries     = 20              // per entrant, on 429 and 503
)

type lotteryResult struct {
	label     string
	sent      int // entrants who tried
	entered   int // 202
	limited   int // 429 answers, retried
	closed    int // 409 entries_closed: the window ended first
	failed    int // anything else, or no answer
	elapsed   time.Duration
	p50, p99  time.Duration
	drawAfter time.Duration // from entries_close_at to the draw readable on the first node
	drawn     int64         // entries the draw counted
	winners   int64
	errSample string // one answer that was neither 202 nor 409
	peakRSS   int64  // the largest peak resident set of the launched nodes (0: not launched)
}

// runLottery runs the lottery scenario against one set of nodes.
func runLottery(ctx context.Context, o *Options, targets []string, pids []int, label, runID string) (lotteryResult, error) {
	r := lotteryResult{label: label}
	clients := newHTTPClients(targets, o.Conns, o.TLS)
	sku := "lottery-" + runID
	closeAt := time.Now().Add(o.Duration)
	body := fmt.Appendf(nil, `{"total":%d,"mode":"lottery","entries_close_at":%q,"hold_ttl":"1h"}`, o.Units, closeAt.UTC().Format(time.RFC3339Nano))
	if code, resp, err := clients.do(0, fasthttp.MethodPut, "/v1/skus/"+sku, o.AdminToken, body); err != nil || code != fasthttp.StatusCreated {
		return r, fmt.Errorf("create lottery %s: %d %s %v", sku, code, resp, err)
	}
	for i := range clients {
		if err := queuebench.WaitUntil(ctx, 10*time.Second, func() bool {
			code, _, _ := clients.do(i, fasthttp.MethodGet, "/v1/skus/"+sku, "", nil)
			return code == fasthttp.StatusOK
		}); err != nil {
			return r, fmt.Errorf("lottery %s on %s: %w", sku, targets[i], err)
		}
	}

	tookNanos := make([]int64, o.Requests)
	var next atomic.Int64
	var entered, limited, closed, failed atomic.Int64
	var lastAnswer atomic.Int64
	var errSample atomic.Pointer[string]
	start := time.Now()
	var wg sync.WaitGroup
	for worker := range o.Conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil && time.Now().Before(closeAt) {
				i := int(next.Add(1) - 1)
				if i >= o.Requests {
					return
				}
				body := fmt.Appendf(nil, `{"user":"e%d-%s"}`, i, runID)
				sent := time.Now()
				for attempt := 0; ; attempt++ {
					code, resp, err := clients.do(worker, fasthttp.MethodPost, "/v1/skus/"+sku+"/enter", o.ServiceToken, body)
					lastAnswer.Store(time.Now().UnixNano())
					if err != nil || (code != fasthttp.StatusAccepted && code != fasthttp.StatusConflict) {
						sample := fmt.Sprintf("%d %s %v", code, strings.TrimSpace(string(resp)), err)
						errSample.CompareAndSwap(nil, &sample)
					}
					switch {
					case err == nil && code == fasthttp.StatusAccepted:
						entered.Add(1)
						tookNanos[i] = int64(time.Since(sent))
					case err == nil && code == fasthttp.StatusConflict:
						closed.Add(1)
						return
					case err == nil && (code == fasthttp.StatusTooManyRequests || code == fasthttp.StatusServiceUnavailable) && attempt < lotteryRetries:
						limited.Add(1)
						time.Sleep(time.Duration(attempt+1) * 10 * time.Millisecond)
						continue
					default:
						failed.Add(1)
					}
					break
				}
			}
		}()
	}
	wg.Wait()
	r.sent = int(min(next.Load(), int64(o.Requests)))
	r.entered, r.limited, r.closed, r.failed = int(entered.Load()), int(limited.Load()), int(closed.Load()), int(failed.Load())
	r.elapsed = time.Unix(0, lastAnswer.Load()).Sub(start)
	if p := errSample.Load(); p != nil {
		r.errSample = *p
	}
	took := slices.DeleteFunc(tookNanos, func(ns int64) bool { return ns == 0 })
	slices.Sort(took)
	if n := len(took); n > 0 {
		r.p50, r.p99 = time.Duration(took[n/2]), time.Duration(took[min(n-1, n*99/100)])
	}

	var draw []byte
	err := queuebench.WaitUntil(ctx, time.Until(closeAt)+lotteryDrawWaitMax, func() bool {
		if time.Now().Before(closeAt) {
			return false
		}
		code, resp, err := clients.do(0, fasthttp.MethodGet, "/v1/skus/"+sku+"/draw", "", nil)
		draw = resp
		return err == nil && code == fasthttp.StatusOK
	})
	if err != nil {
		return r, fmt.Errorf("draw of %s: %w", sku, err)
	}
	r.drawAfter = time.Since(closeAt)
	if rss, ok := procstat.PeakResident(pids); ok {
		r.peakRSS = rss
	}
	r.drawn, r.winners = int64(fastjson.GetInt(draw, "entries")), int64(fastjson.GetInt(draw, "winners"))
	return r, nil
}

func writeLotteryResults(w io.Writer, o *Options, results []lotteryResult) {
	fmt.Fprintf(w, "\nscenario lottery: %d entrants for %d units over %d connections, entries open %s\n", o.Requests, o.Units, o.Conns, o.Duration)
	fmt.Fprintf(w, "%-22s %9s %9s %10s %9s %9s %6s %7s %7s %12s %9s %9s %9s\n",
		"nodes", "sent", "entered", "entries/s", "p50", "p99", "429s", "closed", "failed", "draw after", "drawn", "winners", "peak RSS")
	for _, r := range results {
		rate := float64(r.entered) / max(r.elapsed.Seconds(), 1e-9)
		rss := "-"
		if r.peakRSS > 0 {
			rss = fmt.Sprintf("%d MiB", r.peakRSS>>20)
		}
		fmt.Fprintf(w, "%-22s %9d %9d %10.0f %9s %9s %6d %7d %7d %12s %9d %9d %9s\n", r.label, r.sent, r.entered, rate,
			fmtDur(r.p50), fmtDur(r.p99), r.limited, r.closed, r.failed, fmtDur(r.drawAfter), r.drawn, r.winners, rss)
		if r.errSample != "" {
			fmt.Fprintf(w, "  first other answer: %s\n", r.errSample)
		}
	}
	fmt.Fprintln(w, "(draw after: from entries_close_at until GET .../draw answers on the first node; the leader proposes the draw within 50ms of the close)")
}

// lotteryLabel names a target set in the lottery table.
func lotteryLabel(targets []string) string {
	if len(targets) == 1 {
		return "1 node"
	}
	return fmt.Sprintf("%d nodes (%s…)", len(targets), strings.TrimPrefix(targets[0], "http://"))
}
