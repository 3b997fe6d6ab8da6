package scenario

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"stockd.dev/stockd/node/nodetest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// The crowd test is a sale at the size of a real one: three stockd
// processes, well over a thousand client connections spread over them,
// demand above stock, and a share of request ids sent twice at once to two
// nodes. It has its own target:
//
//	make test-crowd   (STOCKD_CROWD=1 go test -run Crowd .)

const (
	crowdUnits        = 30_000
	crowdBuyers       = 36_000
	crowdConns        = 1_200 // client connections, a third per node
	crowdResendEvery  = 25    // every 25th buyer's request id is also sent to another node at once (4 %)
	crowdDrainTimeout = 10 * time.Second
	crowdAttemptsMax  = 10 // a buyer told 429 comes back after Retry-After, this many times at most
	crowdRetryPause   = time.Second
)

// crowdAnswer is one answer a buyer got.
type crowdAnswer struct {
	code    int
	errCode string
	order   string
}

func (a crowdAnswer) won() bool     { return a.code == 200 }
func (a crowdAnswer) soldOut() bool { return a.code == 409 && a.errCode == "sold_out" }

// crowdDeduct sends one deduct and honours a 429's Retry-After (bounded),
// like a well-behaved client. It returns every answer it got.
func crowdDeduct(c *fasthttp.HostClient, body []byte, tooMany *atomic.Int64) []crowdAnswer {
	var answers []crowdAnswer
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	for attempt := 0; attempt < crowdAttemptsMax; attempt++ {
		req.Reset()
		resp.Reset()
		req.SetRequestURI("http://" + c.Addr + "/v1/skus/crowd/deduct")
		req.Header.SetMethod("POST")
		req.SetBody(body)
		if err := c.DoTimeout(req, resp, 30*time.Second); err != nil {
			answers = append(answers, crowdAnswer{code: 0, errCode: err.Error()})
			return answers
		}
		var out map[string]any
		_ = jsonUnmarshal(resp.Body(), &out)
		a := crowdAnswer{code: resp.StatusCode()}
		a.errCode, _ = out["error"].(string)
		a.order, _ = out["order_id"].(string)
		answers = append(answers, a)
		if a.code != fasthttp.StatusTooManyRequests {
			return answers
		}
		tooMany.Add(1)
		pause := crowdRetryPause
		if secs, err := strconv.Atoi(string(resp.Header.Peek("Retry-After"))); err == nil && secs > 0 {
			pause = min(time.Duration(secs)*time.Second, pause)
		}
		time.Sleep(pause) // the client's back-off, as Retry-After asks
	}
	return answers
}

func TestMultiProcess_CrowdOverThreeNodes(t *testing.T) {
	if os.Getenv("STOCKD_CROWD") == "" {
		t.Skip("set STOCKD_CROWD=1 (make test-crowd) to run a sale of 36,000 buyers over 1,200 connections and three processes")
	}
	for _, v := range []struct {
		name string
		args []string
	}{
		{"fasthttp", []string{"-http-event-loop=false"}},
		{"event-loop", nil}, // the default
	} {
		t.Run(v.name, func(t *testing.T) { crowdOverThreeNodes(t, v.args...) })
	}
}

// crowdOverThreeNodes is the crowd test on nodes started with extraArgs.
func crowdOverThreeNodes(t *testing.T, extraArgs ...string) {
	p := startProcCluster(t, append([]string{"-drain-timeout", crowdDrainTimeout.String()}, extraArgs...)...)
	if code, body := nodetest.Call(t, p.Client("n1"), "PUT", "/v1/skus/crowd", fmt.Sprintf(`{"total":%d}`, crowdUnits)); code != 201 {
		t.Fatalf("create sale: %d %v", code, body)
	}
	nodetest.WaitSaleEverywhere(t, p, "crowd")
	clients := make([]*fasthttp.HostClient, len(p.ids))
	for i, id := range p.ids {
		clients[i] = &fasthttp.HostClient{Addr: p.httpAddr[id], MaxConns: crowdConns, ReadTimeout: 30 * time.Second, WriteTimeout: 10 * time.Second}
	}

	var (
		mu      sync.Mutex
		answers = make(map[int][]crowdAnswer, crowdBuyers) // buyer -> every answer, both calls of a re-sent id
		tooMany atomic.Int64
		total   atomic.Int64
		wg      sync.WaitGroup
	)
	record := func(b int, got []crowdAnswer) {
		total.Add(int64(len(got)))
		mu.Lock()
		answers[b] = append(answers[b], got...)
		mu.Unlock()
	}
	start := time.Now()
	for w := range crowdConns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for b := w; b < crowdBuyers; b += crowdConns {
				body := fmt.Appendf(nil, `{"user":"u%d","qty":1,"request_id":"r%d"}`, b, b)
				home := clients[b%len(clients)]
				if b%crowdResendEvery != 0 {
					record(b, crowdDeduct(home, body, &tooMany))
					continue
				}
				// The same request id to another node while the first call
				// is in flight.
				var twin sync.WaitGroup
				twin.Add(1)
				go func() {
					defer twin.Done()
					record(b, crowdDeduct(clients[(b+1)%len(clients)], body, &tooMany))
				}()
				record(b, crowdDeduct(home, body, &tooMany))
				twin.Wait()
			}
		}()
	}
	wg.Wait()
	lastBuyer := time.Now()
	t.Logf("%d buyers, %d answers over %d connections in %s (%.0f answers/s)", crowdBuyers, total.Load(), crowdConns,
		lastBuyer.Sub(start).Round(time.Millisecond), float64(total.Load())/lastBuyer.Sub(start).Seconds())

	// What buyers were told: no 5xx or transport error, few 429s, no buyer
	// or order twice, no request id answered both a win and a loss.
	outcomes := map[string]int{}
	acked := map[string]bool{}
	orderOf := map[string]int{}
	flips := 0
	for b, got := range answers {
		var win, loss string
		for _, a := range got {
			outcomes[fmt.Sprintf("%d %s", a.code, a.errCode)]++
			switch {
			case a.won():
				if win != "" && win != a.order {
					t.Errorf("buyer %d won twice: %s and %s", b, win, a.order)
				}
				win = a.order
			case a.soldOut():
				loss = a.errCode
			}
		}
		if win != "" && loss != "" {
			flips++
		}
		if win != "" {
			if other, ok := orderOf[win]; ok && other != b {
				t.Errorf("order %s acknowledged to buyers %d and %d", win, other, b)
			}
			orderOf[win], acked[win] = b, true
		}
	}
	t.Logf("answers: %v", outcomes)
	for key, n := range outcomes {
		var code int
		fmt.Sscanf(key, "%d", &code)
		if code == 0 || code >= 500 {
			t.Errorf("%d answers were %q: no 5xx or transport errors allowed", n, key)
		}
	}
	if share := float64(tooMany.Load()) / float64(total.Load()); share >= 0.01 {
		t.Errorf("429 on %.2f %% of answers (%d of %d), want under 1 %%", 100*share, tooMany.Load(), total.Load())
	}
	if flips > 0 {
		t.Errorf("%d request ids were answered both a win and sold_out", flips)
	}
	if len(acked) > crowdUnits {
		t.Fatalf("oversold: %d orders acknowledged for %d units", len(acked), crowdUnits)
	}

	// Nothing stranded: within 5 s of the last buyer every unit is sold.
	var row map[string]any
	deadline := lastBuyer.Add(5 * time.Second)
	for {
		_, row = nodetest.CallQuiet(p.Client(p.Leader()), "GET", "/v1/skus/crowd/audit", "")
		if row != nil && row["sold"].(float64)+row["held"].(float64) == crowdUnits {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("5 s after the last buyer, sold + held != %d: %v", crowdUnits, row)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("sold out %s after the last buyer; %d acknowledged orders", time.Since(lastBuyer).Round(time.Millisecond), len(acked))

	// Followers that reach the leader answer current, not stale, reads.
	for _, id := range p.ids {
		if code, sku := nodetest.CallQuiet(p.Client(id), "GET", "/v1/skus/crowd", ""); code != 200 || sku["stale"] == true {
			t.Errorf("%s after the sale: %d %v, want a current read", id, code, sku)
		}
	}
	// By default the loop served the sale, every node's share of the
	// buyers; with -http-event-loop=false it served none.
	loop := !slices.Contains(extraArgs, "-http-event-loop=false")
	for _, id := range p.ids {
		var served float64
		for _, line := range strings.Split(nodetest.GetRaw(t, p.Client(id), "/metrics"), "\n") {
			fmt.Sscanf(line, "stockd_http_event_loop_deducts_total %g", &served)
		}
		if loop && served < crowdBuyers/float64(len(p.ids)) {
			t.Errorf("%s's event loop answered %v deducts; its share of the buyers is %d", id, served, crowdBuyers/len(p.ids))
		}
		if !loop && served != 0 {
			t.Errorf("%s runs with -http-event-loop=false, and its event loop answered %v deducts", id, served)
		}
	}
	checkClusterLedgers(t, p, "crowd", nil)
	checkOrdersEverywhere(t, p, acked)
	if len(acked) != crowdUnits {
		t.Errorf("%d units sold but %d orders acknowledged: a winner was not told", crowdUnits, len(acked))
	}

	// SIGTERM under full load: a second sale with more stock than anyone
	// buys, all connections busy, and every node told to stop at once.
	if code, body := nodetest.Call(t, p.Client("n1"), "PUT", "/v1/skus/stream", `{"total":10000000}`); code != 201 {
		t.Fatalf("create sale: %d %v", code, body)
	}
	nodetest.WaitSaleEverywhere(t, p, "stream")
	var loaded atomic.Int64
	stop := make(chan struct{})
	loadDeadline := time.Now().Add(30 * time.Second)
	for w := range crowdConns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
			defer fasthttp.ReleaseRequest(req)
			defer fasthttp.ReleaseResponse(resp)
			c := clients[w%len(clients)]
			for i := 0; i < 1000 && time.Now().Before(loadDeadline); i++ {
				select {
				case <-stop:
					return
				default:
				}
				req.Reset()
				req.SetRequestURI("http://" + c.Addr + "/v1/skus/stream/deduct")
				req.Header.SetMethod("POST")
				req.SetBody(fmt.Appendf(nil, `{"user":"s%d-%d","request_id":"s%d-%d"}`, w, i, w, i))
				if err := c.DoTimeout(req, resp, 30*time.Second); err != nil {
					return // the node is gone
				}
				if resp.StatusCode() == 200 {
					loaded.Add(1)
				}
			}
		}()
	}
	nodetest.WaitFor(t, 20*time.Second, "the second sale under load", func() bool { return loaded.Load() >= 5000 })
	stops := p.terminateAll(crowdDrainTimeout + 2*time.Second)
	close(stop)
	wg.Wait()
	for id, took := range stops {
		t.Logf("%s stopped %s after SIGTERM under load (%d deducts acknowledged by then)", id, took.Round(time.Millisecond), loaded.Load())
	}
}

// checkOrdersEverywhere reads every acknowledged order on every node, from
// a few goroutines, and fails on one that is missing or not sold or held.
func checkOrdersEverywhere(t *testing.T, sc nodetest.SalesCluster, acked map[string]bool) {
	t.Helper()
	const readers = 32
	orders := make(chan string)
	var bad atomic.Int64
	var wg sync.WaitGroup
	for range readers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for order := range orders {
				for _, id := range sc.NodeIDs() {
					code, o := nodetest.CallQuiet(sc.Client(id), "GET", "/v1/orders/"+order, "")
					if code != 200 || (o["state"] != "sold" && o["state"] != "held") {
						if bad.Add(1) <= 5 {
							t.Errorf("acknowledged order %s on %s: %d %v", order, id, code, o)
						}
					}
				}
			}
		}()
	}
	for order := range acked {
		orders <- order
	}
	close(orders)
	wg.Wait()
	if bad.Load() > 0 {
		t.Fatalf("%d acknowledged order reads failed", bad.Load())
	}
}

// terminateAll sends SIGTERM to every running node at once and fails the
// test for a node that does not exit cleanly within limit (it is then
// killed). It returns how long each took.
func (p *procCluster) terminateAll(limit time.Duration) map[string]time.Duration {
	took := map[string]time.Duration{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, id := range p.ids {
		cmd, exited := p.detach(id)
		if cmd == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			sent := time.Now()
			cmd.Process.Signal(syscall.SIGTERM)
			select {
			case err := <-exited:
				mu.Lock()
				took[id] = time.Since(sent)
				mu.Unlock()
				var exit *exec.ExitError
				if errors.As(err, &exit) {
					p.t.Errorf("%s exited with %v after SIGTERM", id, err)
				} else if err != nil {
					p.t.Errorf("%s: %v", id, err)
				}
			case <-time.After(limit):
				p.t.Errorf("%s did not stop within %s of SIGTERM; killing it", id, limit)
				cmd.Process.Kill()
				<-exited
			}
		}()
	}
	wg.Wait()
	return took
}
