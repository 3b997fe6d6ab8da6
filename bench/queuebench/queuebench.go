// Package queuebench is stockd bench's queue scenario: a sale behind a
// waiting room (docs/waiting-room.md) as its buyers meet it. Users join
// before the open; at the open each reads its ticket once (a page loading
// its place and ETA); then buyers follow their tickets with long-polls, as
// the buyer's page does, and buy with their token once admitted, while a
// share of them never do, so their admissions run out and let the next in.
// It reports the joins, the open shown on every node, the last admission,
// how long after the last unit sold everyone still waiting was told
// sold_out, the fairness of the draw, the ETA the tickets showed against
// the real admissions, and the server's CPU a call beside a plain sale's.
package queuebench

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fastjson"
)

// Caller sends one request as worker (each worker holds one connection,
// its node chosen by the worker's number).
type Caller interface {
	Do(worker int, method, path, token string, body []byte) (int, []byte, error)
}

// Config is one run's settings.
type Config struct {
	Users int
	Units int64
	Conns int
	Nodes int           // the nodes the Caller spreads its workers over
	Lead  time.Duration // from the sale's creation to its open
	// Never is the share of users who, admitted, never buy.
	Never    float64
	AdmitTTL time.Duration
	// Poll is the long-poll of a ticket in line (the buyer's page's).
	Poll                     time.Duration
	AdminToken, ServiceToken string
	// ServerCPU reads the server processes' CPU so far (false: unknown);
	// PeakRSS their largest peak resident set.
	ServerCPU func() (time.Duration, bool)
	PeakRSS   func() (int64, bool)
}

// Phase is one phase's count, time and server CPU.
type Phase struct {
	N       int
	Elapsed time.Duration
	CPU     time.Duration
	CPUOK   bool
}

// Rate is the phase's calls a second.
func (ph Phase) Rate() float64 { return float64(ph.N) / max(ph.Elapsed.Seconds(), 1e-9) }

// CPUEach is the server CPU a call, or "-".
func (ph Phase) CPUEach() string {
	if !ph.CPUOK || ph.N == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f µs", float64(ph.CPU.Nanoseconds())/1e3/float64(ph.N))
}

// Result is one run against one set of nodes.
type Result struct {
	Label string
	Users int
	Units int64
	// Joins: every user once. Follow: from the open until every follower
	// had its last answer, N the units bought. Plain and SoldOut: as many
	// committed deducts of a plain sale, and sold-out answers of it.
	Joins, Follow, Plain, SoldOut Phase
	// From start_at: the open shown on every node; the admission of the
	// last position admitted; every follower answered for good.
	OpenShown, LastAdmitted, AllAnswered time.Duration
	// ToldSoldOut: from the answer to the last winning buy until the last
	// long-poll in flight then answered sold_out; Told how many did.
	ToldSoldOut time.Duration
	Told        int
	// NodesTold is each node's own figure (sold_out_told_after): from the
	// entry that sold the last unit until it woke every long-poll.
	NodesTold []string
	// Tickets by how they ended: bought, told sold_out, admitted and never
	// used (the never-buyers), run out.
	Bought, SoldOutTickets, NeverUsed, Expired int
	Admitted                                   int
	// RankCorr is Spearman's rank correlation between the pre-open
	// tickets' join order and their positions: near 0 when arriving first
	// bought no place in line.
	RankCorr  float64
	ETA       ETAStats
	Failed    int
	ErrSample string
	PeakRSS   int64
}

// ETAStats compare the ETAs the tickets showed in line with when their
// positions were admitted.
type ETAStats struct {
	Users  int // admitted users that were shown an ETA
	Shown  int // ETAs shown to them
	Median time.Duration
	P90    time.Duration // absolute errors
	// WentUp is the share of a user's successive ETAs (Pairs) whose
	// moment moved later by more than a second; UsersUp the users who saw
	// that at least once.
	WentUp         float64
	Pairs, UsersUp int
	// Unknown counts answers in line that had no ETA yet (no admission
	// measured).
	Unknown int
}

const retries = 20 // per call, on 429 and 503

// run holds one run's shared state.
type run struct {
	cfg       *Config
	c         Caller
	failed    atomic.Int64
	errSample atomic.Pointer[string]
}

// call sends a request, retrying 429 and 503 a few times; ok when the
// answer is want.
func (r *run) call(worker int, method, path, token string, body []byte, want int) (bool, int, []byte) {
	for attempt := 0; ; attempt++ {
		code, resp, err := r.c.Do(worker, method, path, token, body)
		switch {
		case err == nil && code == want:
			return true, code, resp
		case err == nil && (code == 429 || code == 503) && attempt < retries:
			time.Sleep(time.Duration(attempt+1) * 10 * time.Millisecond)
			continue
		}
		r.fail(fmt.Sprintf("%s %s: %d %s %v", method, path, code, strings.TrimSpace(string(resp)), err))
		return false, code, resp
	}
}

func (r *run) fail(sample string) {
	r.failed.Add(1)
	r.errSample.CompareAndSwap(nil, &sample)
}

// Run runs the scenario against one set of nodes; runID names its sales.
func Run(ctx context.Context, cfg Config, c Caller, label, runID string) (Result, error) {
	res := Result{Label: label, Users: cfg.Users, Units: cfg.Units}
	r := &run{cfg: &cfg, c: c}
	queued, plain, warm := "queue-"+runID, "plain-"+runID, "warm-"+runID
	start := time.Now().Add(cfg.Lead)
	if err := r.createSales(ctx, queued, plain, warm, start); err != nil {
		return res, err
	}
	secrets := make([]string, cfg.Users)
	res.Joins = r.measure(func() int {
		return Parallel(cfg.Conns, cfg.Users, func(worker, i int) bool {
			ok, _, resp := r.call(worker, "POST", "/v1/skus/"+queued+"/queue", cfg.ServiceToken, fmt.Appendf(nil, `{"user":"%s"}`, userName(i, runID)), 200)
			if ok {
				secrets[i] = fastjson.GetString(resp, "ticket")
			}
			return ok
		})
	})
	if time.Now().After(start) {
		return res, fmt.Errorf("the joins took %s, past the open: give -duration more than that", res.Joins.Elapsed.Round(time.Millisecond))
	}
	if err := WaitUntil(ctx, time.Until(start)+time.Minute, func() bool {
		for i := range cfg.Nodes {
			_, resp, err := c.Do(i, "GET", "/v1/skus/"+queued+"/queue", "", nil)
			if err != nil || fastjson.GetString(resp, "seed") == "" {
				return false
			}
		}
		return true
	}); err != nil {
		return res, fmt.Errorf("the open of %s: %w", queued, err)
	}
	res.OpenShown = time.Since(start)
	line, rho, err := r.lineOrder(queued, secrets)
	if err != nil {
		return res, err
	}
	res.RankCorr = rho
	var users []*follower
	res.Follow = r.measure(func() int {
		users = r.follow(queued, runID, secrets, line)
		return count(users, func(u *follower) bool { return u.end == "bought" })
	})
	r.summarize(&res, users, start)
	for i := range cfg.Nodes {
		_, resp, err := c.Do(i, "GET", "/v1/skus/"+queued+"/queue", "", nil)
		told := fastjson.GetString(resp, "sold_out_told_after")
		if err != nil || told == "" {
			told = "-"
		}
		res.NodesTold = append(res.NodesTold, told)
	}
	n := int(min(cfg.Units, int64(cfg.Users)))
	r.deducts(warm, n, 200, func(i int) string { return fmt.Sprintf(`{"user":"w%d-%s"}`, i, runID) })
	res.Plain = r.measure(func() int {
		return r.deducts(plain, n, 200, func(i int) string { return fmt.Sprintf(`{"user":"p%d-%s","request_id":"pb-%d"}`, i, runID, i) })
	})
	res.SoldOut = r.measure(func() int {
		return r.deducts(plain, n, 409, func(i int) string { return fmt.Sprintf(`{"user":"s%d-%s"}`, i, runID) })
	})
	res.Failed = int(r.failed.Load())
	if p := r.errSample.Load(); p != nil {
		res.ErrSample = *p
	}
	if cfg.PeakRSS != nil {
		res.PeakRSS, _ = cfg.PeakRSS()
	}
	return res, nil
}

func userName(i int, runID string) string { return fmt.Sprintf("q%d-%s", i, runID) }

// neverBuys reports whether user i is one who never buys: spread evenly
// over the users, a share of cfg.Never.
func (r *run) neverBuys(i int) bool {
	share := r.cfg.Never
	return share > 0 && int(float64(i+1)*share) > int(float64(i)*share)
}

func (r *run) createSales(ctx context.Context, queued, plain, warm string, start time.Time) error {
	cfg := r.cfg
	for sku, body := range map[string]string{
		queued: fmt.Sprintf(`{"total":%d,"admission":"queue","queue_admit_ttl":%q,"start_at":%q}`, cfg.Units, cfg.AdmitTTL, start.UTC().Format(time.RFC3339Nano)),
		plain:  fmt.Sprintf(`{"total":%d}`, cfg.Units),
		warm:   fmt.Sprintf(`{"total":%d}`, cfg.Units),
	} {
		if code, resp, err := r.c.Do(0, "PUT", "/v1/skus/"+sku, cfg.AdminToken, []byte(body)); err != nil || code != 201 {
			return fmt.Errorf("create %s: %d %s %v", sku, code, resp, err)
		}
		for i := range cfg.Nodes {
			if err := WaitUntil(ctx, 10*time.Second, func() bool {
				code, _, _ := r.c.Do(i, "GET", "/v1/skus/"+sku, "", nil)
				return code == 200
			}); err != nil {
				return fmt.Errorf("sale %s on node %d: %w", sku, i+1, err)
			}
		}
	}
	return nil
}

// deducts sends n deducts to sku, bodies from body, and counts the
// answers that were want.
func (r *run) deducts(sku string, n, want int, body func(i int) string) int {
	return Parallel(r.cfg.Conns, n, func(worker, i int) bool {
		ok, _, _ := r.call(worker, "POST", "/v1/skus/"+sku+"/deduct", r.cfg.ServiceToken, []byte(body(i)), want)
		return ok
	})
}

// measure runs phase, which returns how many of its calls succeeded, and
// reads the server CPU it took.
func (r *run) measure(phase func() int) Phase {
	read := r.cfg.ServerCPU
	if read == nil {
		read = func() (time.Duration, bool) { return 0, false }
	}
	cpu0, ok0 := read()
	t0 := time.Now()
	n := phase()
	elapsed := time.Since(t0)
	cpu1, ok1 := read()
	return Phase{N: n, Elapsed: elapsed, CPU: cpu1 - cpu0, CPUOK: ok0 && ok1}
}

// lineOrder reads the tickets stream of sku: each user's position (by
// their index in secrets; 0: not in the stream), and Spearman's rank
// correlation between join order and position.
func (r *run) lineOrder(sku string, secrets []string) ([]int64, float64, error) {
	userOf := make(map[string]int, len(secrets))
	for i, s := range secrets {
		if s != "" {
			sum := sha256.Sum256([]byte(s))
			userOf[hex.EncodeToString(sum[:])] = i
		}
	}
	code, stream, err := r.c.Do(0, "GET", "/v1/skus/"+sku+"/queue/tickets", r.cfg.ServiceToken, nil)
	if err != nil || code != 200 {
		return nil, 0, fmt.Errorf("tickets of %s: %d %v", sku, code, err)
	}
	pos := make([]int64, len(secrets))
	var sumD2, n float64
	for line := range strings.Lines(string(stream)) {
		b := []byte(line)
		joined, p := fastjson.GetInt(b, "joined_index"), fastjson.GetInt(b, "position")
		if joined > 0 && p > 0 {
			d := float64(joined - p)
			sumD2, n = sumD2+d*d, n+1
		}
		if i, ok := userOf[fastjson.GetString(b, "ticket_id")]; ok {
			pos[i] = int64(p)
		}
	}
	rho := 0.0
	if n > 1 {
		rho = 1 - 6*sumD2/(n*(n*n-1))
	}
	return pos, rho, nil
}

// Parallel runs call for 0..n-1 on workers goroutines and counts the
// calls that succeeded.
func Parallel(workers, n int, call func(worker, i int) bool) int {
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

// WaitUntil polls cond every 5ms until it holds, ctx ends or within passes.
func WaitUntil(ctx context.Context, within time.Duration, cond func() bool) error {
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("not within %s", within)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
	return nil
}

func count[T any](s []T, f func(T) bool) int {
	n := 0
	for _, v := range s {
		if f(v) {
			n++
		}
	}
	return n
}
