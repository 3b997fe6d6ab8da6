package bench

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fastjson"
)

// The queue scenario: -requests users join a sale of -units behind a
// waiting room (docs/waiting-room.md) over -conns connections, before its
// open -duration after its creation; the harness times the open until
// every node shows it, waits for the leader to admit the first -units
// positions, reads their tokens, and has them buy. Then, in the same run,
// (after as many unmeasured plain deducts, a warm-up) as many committed
// deducts of a plain sale and as many sold-out answers of it: the server's CPU per join, per queued deduct, per plain deduct
// and per sold-out answer side by side, from /proc of the launched nodes.

const queueScenario = "queue"

const (
	queueAdmitWaitMax = 5 * time.Minute
	queueRetries      = 20 // per call, on 429 and 503
)

// queuePhase is one phase's count, time and server CPU.
type queuePhase struct {
	n       int
	elapsed time.Duration
	cpu     time.Duration
	cpuOK   bool
}

func (ph queuePhase) rate() float64 { return float64(ph.n) / max(ph.elapsed.Seconds(), 1e-9) }

func (ph queuePhase) cpuEach() string {
	if !ph.cpuOK || ph.n == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f µs", float64(ph.cpu.Microseconds())/float64(ph.n))
}

type queueResult struct {
	label                  string
	joins, queued, plain   queuePhase
	soldOut                queuePhase
	openReadable, admitted time.Duration // from start_at: the open shown on every node; the first -units positions admitted
	failed                 int
	errSample              string
	peakRSS                int64
	// rankCorr is Spearman's rank correlation between the pre-open
	// tickets' join order and their positions: near 0 when arriving first
	// bought no place in line.
	rankCorr float64
}

// runQueue runs the queue scenario against one set of nodes.
func runQueue(ctx context.Context, o *Options, targets []string, pids []int, label, runID string) (queueResult, error) {
	r := queueResult{label: label}
	clients := newHTTPClients(targets, o.Conns, o.TLS)
	queued, plain, warm := "queue-"+runID, "plain-"+runID, "warm-"+runID
	start := time.Now().Add(o.Duration)
	if err := createQueueSales(ctx, clients, o, targets, queued, plain, warm, start); err != nil {
		return r, err
	}
	var failed atomic.Int64
	var errSample atomic.Pointer[string]
	call := func(worker int, method, path, token string, body []byte, want int) (bool, []byte) {
		for attempt := 0; ; attempt++ {
			code, resp, err := clients.do(worker, method, path, token, body)
			switch {
			case err == nil && code == want:
				return true, resp
			case err == nil && (code == fasthttp.StatusTooManyRequests || code == fasthttp.StatusServiceUnavailable) && attempt < queueRetries:
				time.Sleep(time.Duration(attempt+1) * 10 * time.Millisecond)
				continue
			}
			failed.Add(1)
			sample := fmt.Sprintf("%s %s: %d %s %v", method, path, code, strings.TrimSpace(string(resp)), err)
			errSample.CompareAndSwap(nil, &sample)
			return false, resp
		}
	}

	// Joins, each user once.
	secrets := make([]string, o.Requests)
	r.joins = measure(pids, func() int {
		return parallel(o.Conns, o.Requests, func(worker, i int) bool {
			ok, resp := call(worker, fasthttp.MethodPost, "/v1/skus/"+queued+"/queue", o.ServiceToken, fmt.Appendf(nil, `{"user":"q%d-%s"}`, i, runID), fasthttp.StatusOK)
			if ok {
				secrets[i] = fastjson.GetString(resp, "ticket")
			}
			return ok
		})
	})
	if time.Now().After(start) {
		return r, fmt.Errorf("the joins took %s, past the open: give -duration more than that", r.joins.elapsed.Round(time.Millisecond))
	}

	// The open, on every node; then the first -units positions admitted.
	err := waitUntil(ctx, time.Until(start)+time.Minute, func() bool {
		for i := range clients {
			_, resp, err := clients.do(i, fasthttp.MethodGet, "/v1/skus/"+queued+"/queue", "", nil)
			if err != nil || fastjson.GetString(resp, "seed") == "" {
				return false
			}
		}
		return true
	})
	if err != nil {
		return r, fmt.Errorf("the open of %s: %w", queued, err)
	}
	r.openReadable = time.Since(start)
	want := int(min(o.Units, int64(o.Requests)))
	if err := waitUntil(ctx, queueAdmitWaitMax, func() bool {
		_, resp, err := clients.do(0, fasthttp.MethodGet, "/v1/skus/"+queued+"/queue", "", nil)
		return err == nil && fastjson.GetInt(resp, "admitted_total") >= want
	}); err != nil {
		return r, fmt.Errorf("admissions of %s: %w", queued, err)
	}
	r.admitted = time.Since(start)

	// The admitted positions' tokens, then their purchases.
	tokens, users, rho, err := admittedTokens(clients, queued, o.ServiceToken, secrets, want)
	if err != nil {
		return r, err
	}
	r.rankCorr = rho
	r.queued, r.plain, r.soldOut = buyPhases(o, pids, call, tokens, users, queued, plain, warm, runID)
	r.failed = int(failed.Load())
	if p := errSample.Load(); p != nil {
		r.errSample = *p
	}
	if rss, ok := peakResident(pids); ok {
		r.peakRSS = rss
	}
	return r, nil
}

// createQueueSales creates the scenario's queued sale, opening at start,
// and its plain one, and waits until every node knows both.
func createQueueSales(ctx context.Context, clients httpClients, o *Options, targets []string, queued, plain, warm string, start time.Time) error {
	for sku, body := range map[string]string{
		queued: fmt.Sprintf(`{"total":%d,"admission":"queue","queue_admit_ttl":"10m","start_at":%q}`, o.Units, start.UTC().Format(time.RFC3339Nano)),
		plain:  fmt.Sprintf(`{"total":%d}`, o.Units),
		warm:   fmt.Sprintf(`{"total":%d}`, o.Units),
	} {
		if code, resp, err := clients.do(0, fasthttp.MethodPut, "/v1/skus/"+sku, o.AdminToken, []byte(body)); err != nil || code != fasthttp.StatusCreated {
			return fmt.Errorf("create %s: %d %s %v", sku, code, resp, err)
		}
		for i := range clients {
			if err := waitUntil(ctx, 10*time.Second, func() bool {
				code, _, _ := clients.do(i, fasthttp.MethodGet, "/v1/skus/"+sku, "", nil)
				return code == fasthttp.StatusOK
			}); err != nil {
				return fmt.Errorf("sale %s on %s: %w", sku, targets[i], err)
			}
		}
	}
	return nil
}

// buyPhases has the admitted users buy with their tokens, then as many
// plain committed deducts and sold-out answers, each measured, after a
// warm-up of as many plain deducts that is not: the first deducts of a
// run pay for leases, connections and the allocator's growth, and would
// weigh on whichever phase came first.
func buyPhases(o *Options, pids []int, call func(worker int, method, path, token string, body []byte, want int) (bool, []byte),
	tokens []string, users []int, queued, plain, warm, runID string) (q, p, soldOut queuePhase) {
	deducts := func(sku string, want int, body func(i int) []byte) int {
		return parallel(o.Conns, len(tokens), func(worker, i int) bool {
			ok, _ := call(worker, fasthttp.MethodPost, "/v1/skus/"+sku+"/deduct", o.ServiceToken, body(i), want)
			return ok
		})
	}
	deducts(warm, fasthttp.StatusOK, func(i int) []byte { return fmt.Appendf(nil, `{"user":"w%d-%s"}`, i, runID) })
	q = measure(pids, func() int {
		return deducts(queued, fasthttp.StatusOK, func(i int) []byte {
			return fmt.Appendf(nil, `{"user":"q%d-%s","request_id":"qb-%d","admission_token":%q}`, users[i], runID, i, tokens[i])
		})
	})
	p = measure(pids, func() int {
		return deducts(plain, fasthttp.StatusOK, func(i int) []byte { return fmt.Appendf(nil, `{"user":"p%d-%s","request_id":"pb-%d"}`, i, runID, i) })
	})
	soldOut = measure(pids, func() int {
		return deducts(plain, fasthttp.StatusConflict, func(i int) []byte { return fmt.Appendf(nil, `{"user":"s%d-%s"}`, i, runID) })
	})
	return q, p, soldOut
}

// measure runs phase, which returns how many of its calls succeeded, and
// reads the server CPU it took.
func measure(pids []int, phase func() int) queuePhase {
	cpu0, ok0 := processCPU(pids)
	t0 := time.Now()
	n := phase()
	elapsed := time.Since(t0)
	cpu1, ok1 := processCPU(pids)
	return queuePhase{n: n, elapsed: elapsed, cpu: cpu1 - cpu0, cpuOK: ok0 && ok1 && len(pids) > 0}
}

// parallel runs call for 0..n-1 on workers goroutines and counts the
// calls that succeeded.
func parallel(workers, n int, call func(worker, i int) bool) int {
	var next, ok atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < n; i = int(next.Add(1) - 1) {
				if call(w, i) {
					ok.Add(1)
				}
			}
		})
	}
	wg.Wait()
	return int(ok.Load())
}

// admittedTokens reads the tickets stream of sku and the tokens of its
// first want positions: the tokens, each one's user (its index in
// secrets), and Spearman's rank correlation between join order and
// position.
func admittedTokens(clients httpClients, sku, token string, secrets []string, want int) ([]string, []int, float64, error) {
	userOf := make(map[string]int, len(secrets))
	for i, s := range secrets {
		if s != "" {
			sum := sha256.Sum256([]byte(s))
			userOf[hex.EncodeToString(sum[:])] = i
		}
	}
	code, stream, err := clients.do(0, fasthttp.MethodGet, "/v1/skus/"+sku+"/queue/tickets", token, nil)
	if err != nil || code != fasthttp.StatusOK {
		return nil, nil, 0, fmt.Errorf("tickets of %s: %d %v", sku, code, err)
	}
	var sumD2, n float64
	for line := range strings.Lines(string(stream)) {
		joined, pos := fastjson.GetInt([]byte(line), "joined_index"), fastjson.GetInt([]byte(line), "position")
		if joined > 0 && pos > 0 {
			d := float64(joined - pos)
			sumD2, n = sumD2+d*d, n+1
		}
	}
	rho := 0.0
	if n > 1 {
		rho = 1 - 6*sumD2/(n*(n*n-1))
	}
	var tokens []string
	var users []int
	for line := range strings.Lines(string(stream)) {
		if len(tokens) == want {
			break
		}
		i, ok := userOf[fastjson.GetString([]byte(line), "ticket_id")]
		if !ok {
			continue
		}
		_, resp, err := clients.do(0, fasthttp.MethodGet, "/v1/queue/"+secrets[i], token, nil)
		tok := fastjson.GetString(resp, "admission_token")
		if err != nil || tok == "" {
			return nil, nil, 0, fmt.Errorf("the ticket at position %d of %s is not admitted: %s %v", len(tokens)+1, sku, resp, err)
		}
		tokens, users = append(tokens, tok), append(users, i)
	}
	return tokens, users, rho, nil
}

// runQueues runs the queue scenario against every target cluster.
func runQueues(ctx context.Context, o *Options, t targets, runID string, stdout io.Writer) error {
	if len(t.sets) == 0 {
		return fmt.Errorf("-scenario %s needs -launch or -target", queueScenario)
	}
	var results []queueResult
	for j, nodes := range t.sets {
		var pids []int
		if j < len(t.pids) {
			pids = t.pids[j]
		}
		r, err := runQueue(ctx, o, nodes, pids, lotteryLabel(nodes), runID+"-"+strconv.Itoa(j))
		if err != nil {
			return err
		}
		results = append(results, r)
	}
	writeQueueResults(stdout, o, results)
	return nil
}

func writeQueueResults(w io.Writer, o *Options, results []queueResult) {
	fmt.Fprintf(w, "\nscenario queue: %d users join a sale of %d units behind a waiting room over %d connections; the first %d positions buy with their tokens\n",
		o.Requests, o.Units, o.Conns, min(o.Units, int64(o.Requests)))
	fmt.Fprintf(w, "%-22s %9s %10s %12s %12s %10s %11s %10s %11s %10s %11s %10s %9s\n", "nodes", "joins/s", "cpu/join", "open shown",
		"admitted", "queued/s", "cpu/queued", "plain/s", "cpu/plain", "soldout/s", "cpu/soldout", "token", "peak RSS")
	for _, r := range results {
		token := "-"
		if r.queued.cpuOK && r.plain.cpuOK && r.queued.n > 0 && r.plain.n > 0 {
			q, p := float64(r.queued.cpu)/float64(r.queued.n), float64(r.plain.cpu)/float64(r.plain.n)
			token = fmt.Sprintf("%+.0f%%", (q-p)/p*100)
		}
		rss := "-"
		if r.peakRSS > 0 {
			rss = fmt.Sprintf("%d MiB", r.peakRSS>>20)
		}
		fmt.Fprintf(w, "%-22s %9.0f %10s %12s %12s %10.0f %11s %10.0f %11s %10.0f %11s %10s %9s\n", r.label, r.joins.rate(), r.joins.cpuEach(),
			fmtDur(r.openReadable), fmtDur(r.admitted), r.queued.rate(), r.queued.cpuEach(), r.plain.rate(), r.plain.cpuEach(),
			r.soldOut.rate(), r.soldOut.cpuEach(), token, rss)
		fmt.Fprintf(w, "  fairness: rank correlation of join order and position %+.4f (0: arriving first bought no place)\n", r.rankCorr)
		if r.failed > 0 {
			fmt.Fprintf(w, "  %d calls failed; the first: %s\n", r.failed, r.errSample)
		}
	}
	fmt.Fprintln(w, "(cpu: the launched nodes' user+system CPU a call, summed over the nodes; open shown: from start_at until every node shows the seed;")
	fmt.Fprintln(w, " admitted: from start_at until the leader admitted the first positions; token: a queued deduct's CPU against a plain committed one's)")
}
