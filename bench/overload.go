package bench

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fastjson"
)

// The overload scenario: what a slow ledger does to deducts, with
// admission following the ledger and without it. It launches one node
// whose ledger stalls every batch (-fault-apply-delay) and whose batches
// are small, so the ledger commits a few hundred deducts a second, and
// sends an open load above that: arrivals at a fixed rate, each on its
// own, whatever the answers (a closed load of waiting clients would slow
// down with the node and hide the queue). Then the same against a node
// with -admission-latency 0.

const overloadScenario = "overload"

const (
	overloadApplyDelay = 50 * time.Millisecond
	overloadRate       = 600 // deducts a second
	overloadDuration   = 4 * time.Second
	overloadTimeout    = 20 * time.Second
)

type overloadResult struct {
	label    string
	sent     int
	admitted int
	limited  int
	timedOut int // 504 outcome_unknown, or no answer
	other    int
	p50, p99 time.Duration
}

func runOverload(ctx context.Context, o *Options, bin, dir string, w io.Writer) error {
	if len(o.Targets) > 0 {
		return fmt.Errorf("-scenario %s launches its own node; it takes no -target", overloadScenario)
	}
	fmt.Fprintf(w, "\nscenario overload: one node, every ledger batch stalled %s, batches of about a dozen takes; an open load of %d deducts/s for %s\n",
		overloadApplyDelay, overloadRate, overloadDuration)
	var results []overloadResult
	for _, adaptive := range []bool{true, false} {
		latency := "300ms"
		label := "admission follows the ledger (-admission-latency 300ms)"
		if !adaptive {
			latency, label = "0", "fixed admission (-admission-latency 0)"
		}
		nodes, err := launchCluster(bin, filepath.Join(dir, "overload-"+latency), 1, false, nil,
			"-fault-apply-delay", overloadApplyDelay.String(), "-admission-latency", latency, "-take-batch-bytes", "1024", "-commit-wait", "2s")
		if err != nil {
			return err
		}
		r, err := overloadRun(ctx, nodes[0].url, o, label)
		for _, l := range nodes {
			l.stop()
		}
		if err != nil {
			return err
		}
		results = append(results, r)
	}
	fmt.Fprintf(w, "%-58s %6s %9s %9s %9s %7s %9s %9s\n", "admission", "sent", "admitted", "p50", "p99", "429", "timeouts", "other")
	for _, r := range results {
		fmt.Fprintf(w, "%-58s %6d %9d %9s %9s %6.0f%% %9d %9d\n", r.label, r.sent, r.admitted, fmtDur(r.p50), fmtDur(r.p99),
			100*float64(r.limited)/float64(max(r.sent, 1)), r.timedOut, r.other)
	}
	fmt.Fprintln(w, "(p50/p99: admitted deducts; timeouts: 504 outcome_unknown or no answer within 20s)")
	return nil
}

// overloadRun sends the open load to one node and sorts its answers.
func overloadRun(ctx context.Context, url string, o *Options, label string) (overloadResult, error) {
	hc := &fasthttp.HostClient{Addr: url[len("http://"):], MaxConns: 4096, ReadTimeout: overloadTimeout, WriteTimeout: overloadTimeout}
	sku := fmt.Sprintf("overload-%d", time.Now().UnixNano())
	if code, body, err := (httpClients{hc}).do(0, fasthttp.MethodPut, "/v1/skus/"+sku, o.AdminToken, []byte(`{"total":1000000}`)); err != nil || code != fasthttp.StatusCreated {
		return overloadResult{}, fmt.Errorf("create sale %s: %d %s %v", sku, code, body, err)
	}
	total := int(overloadRate * overloadDuration / time.Second)
	type answer struct {
		code   int
		reason string
		took   time.Duration
	}
	answers := make([]answer, total)
	var wg sync.WaitGroup
	tick := time.NewTicker(time.Second / overloadRate)
	defer tick.Stop()
	for i := range total {
		select {
		case <-tick.C:
		case <-ctx.Done():
			return overloadResult{}, ctx.Err()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			body := fmt.Appendf(nil, `{"user":"u%d","request_id":"%s-%d"}`, i, sku, i)
			code, resp, err := (httpClients{hc}).do(0, fasthttp.MethodPost, "/v1/skus/"+sku+"/deduct", o.ServiceToken, body)
			a := answer{code: code, took: time.Since(start)}
			if err == nil {
				a.reason = string(fastjson.GetBytes(resp, "error"))
			}
			answers[i] = a
		}()
	}
	wg.Wait()
	r := overloadResult{label: label, sent: total}
	var admitted []time.Duration
	for _, a := range answers {
		switch {
		case a.code == fasthttp.StatusOK:
			r.admitted++
			admitted = append(admitted, a.took)
		case a.code == fasthttp.StatusTooManyRequests:
			r.limited++
		case a.code == 0 || a.code == fasthttp.StatusGatewayTimeout:
			r.timedOut++
		default:
			r.other++
		}
	}
	slices.Sort(admitted)
	if n := len(admitted); n > 0 {
		r.p50, r.p99 = admitted[n/2], admitted[min(n-1, n*99/100)]
	}
	return r, nil
}
