package bench

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
)

// Limits that keep a run bounded on a small machine.
const (
	maxBuyers      = 10_000_000 // latency samples are kept in memory: 80 MB at most
	maxConns       = 4096
	maxRunDuration = 10 * time.Minute
	requestTimeout = 30 * time.Second
)

// Options is one run's configuration.
type Options struct {
	Targets    []string // node base URLs; empty with Launch > 0
	Launches   []int    // launch a local cluster of each size in turn (1, 3)
	Units      int64
	Buyers     int
	Conns      int
	Duration   time.Duration // stop issuing requests after this long
	NoWait     bool
	SKU        string
	AdminToken string
	Binary     string // stockd binary to launch; default: this executable
}

func parseFlags(args []string, stderr io.Writer) (Options, error) {
	var o Options
	var targets, wait, launch string
	fs := flag.NewFlagSet("stockd bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&targets, "target", "", "comma-separated node URLs to load, e.g. http://127.0.0.1:8080 (requests are spread over them)")
	fs.StringVar(&launch, "launch", "", "launch local nodes in a temp dir instead of -target and stop them afterwards: 1, 3, or 1,3 to run the same load against one node and then a three-node cluster and compare")
	fs.Int64Var(&o.Units, "units", 1000, "units put on sale")
	fs.IntVar(&o.Buyers, "buyers", 100_000, "distinct buyers, one deduct request each")
	fs.IntVar(&o.Conns, "conns", 64, "concurrent connections (one worker goroutine each, no pipelining)")
	fs.DurationVar(&o.Duration, "duration", time.Minute, "stop sending after this long even if buyers remain")
	fs.StringVar(&wait, "wait", "commit", "commit: answer after the sale is replicated; none: answer after the stock CAS")
	fs.StringVar(&o.SKU, "sku", "", "SKU to create for the run (default: bench-<unix time>)")
	fs.StringVar(&o.AdminToken, "admin-token", os.Getenv("STOCKD_ADMIN_TOKEN"), "admin token of the target nodes (default $STOCKD_ADMIN_TOKEN)")
	fs.StringVar(&o.Binary, "binary", "", "stockd binary for -launch (default: this executable)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, `usage: stockd bench [-launch 1 | -target URL,...] [flags]

Runs a flash sale: creates a SKU of -units, sends one deduct for each of
-buyers distinct users over -conns connections, then prints throughput,
latency percentiles, outcomes, and the ledger's final counts with the
oversell check (oversold must be 0).`)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if targets != "" {
		for _, t := range strings.Split(targets, ",") {
			o.Targets = append(o.Targets, strings.TrimRight(strings.TrimSpace(t), "/"))
		}
	}
	if launch != "" {
		for _, part := range strings.Split(launch, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(part))
			if err != nil || (n != 1 && n != 3) {
				return o, fmt.Errorf("-launch %q: each entry must be 1 or 3", launch)
			}
			o.Launches = append(o.Launches, n)
		}
	}
	switch wait {
	case "commit":
	case "none":
		o.NoWait = true
	default:
		return o, fmt.Errorf("-wait %q: want commit or none", wait)
	}
	if o.SKU == "" {
		o.SKU = "bench-" + strconv.FormatInt(time.Now().Unix(), 10)
	}
	return o, o.validate()
}

func (o *Options) validate() error {
	switch {
	case len(o.Targets) == 0 && len(o.Launches) == 0:
		return errors.New("give -target URL,... or -launch 1|3|1,3")
	case len(o.Targets) > 0 && len(o.Launches) > 0:
		return errors.New("-target and -launch exclude each other")
	case o.Units < 0:
		return fmt.Errorf("-units %d < 0", o.Units)
	case o.Buyers < 1 || o.Buyers > maxBuyers:
		return fmt.Errorf("-buyers %d outside 1..%d", o.Buyers, maxBuyers)
	case o.Conns < 1 || o.Conns > maxConns:
		return fmt.Errorf("-conns %d outside 1..%d", o.Conns, maxConns)
	case o.Duration <= 0 || o.Duration > maxRunDuration:
		return fmt.Errorf("-duration %s outside (0, %s]", o.Duration, maxRunDuration)
	}
	for _, t := range o.Targets {
		if !strings.HasPrefix(t, "http://") {
			return fmt.Errorf("-target %q: want http://host:port", t)
		}
	}
	return nil
}

// Main runs `stockd bench`.
func Main(args []string, stdout, stderr io.Writer) error {
	o, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	if len(o.Launches) > 0 {
		return runLaunched(o, stdout)
	}
	r, err := Run(o)
	if err != nil {
		return err
	}
	r.Print(stdout)
	if r.Oversold != 0 {
		return fmt.Errorf("oversold %d units", r.Oversold)
	}
	return nil
}

// Report is one run's result.
type Report struct {
	Options  Options
	Elapsed  time.Duration
	Sent     int
	Latency  Summary
	Outcomes map[string]int // "409 sold_out" -> count
	Wins     int            // distinct orders acknowledged (200 or 202)
	Ledger   LedgerCounts
	Oversold int64
}

// LedgerCounts is the final audit of the run's SKU.
type LedgerCounts struct {
	OK        bool             `json:"ok"`
	Problem   string           `json:"problem"`
	Total     int64            `json:"total"`
	Available int64            `json:"available"`
	Leased    map[string]int64 `json:"leased"`
	Held      int64            `json:"held"`
	Sold      int64            `json:"sold"`
	Orders    int64            `json:"orders"`
}

// Run creates the sale, sends the load and audits the ledger.
func Run(o Options) (*Report, error) {
	clients := make([]*fasthttp.HostClient, len(o.Targets))
	for i, t := range o.Targets {
		clients[i] = &fasthttp.HostClient{
			Addr: strings.TrimPrefix(t, "http://"), MaxConns: o.Conns,
			ReadTimeout: requestTimeout, WriteTimeout: requestTimeout,
		}
	}
	if err := createSale(clients[0], o); err != nil {
		return nil, err
	}
	// Followers learn of the sale when they apply it; start the clock once
	// every target knows it.
	for _, c := range clients {
		if err := waitForSale(c, o.SKU); err != nil {
			return nil, err
		}
	}

	path := "/v1/skus/" + o.SKU + "/deduct"
	if o.NoWait {
		path += "?wait=none"
	}
	runID := strconv.FormatInt(time.Now().UnixNano(), 36)
	var next atomic.Int64
	stopAt := time.Now().Add(o.Duration)
	type workerResult struct {
		lat      *Latencies
		outcomes map[string]int
		orders   []string
	}
	results := make([]workerResult, o.Conns)
	var wg sync.WaitGroup
	start := time.Now()
	for w := 0; w < o.Conns; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			res := workerResult{lat: NewLatencies(o.Buyers/o.Conns + 1), outcomes: map[string]int{}}
			client := clients[w%len(clients)]
			req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
			defer fasthttp.ReleaseRequest(req)
			defer fasthttp.ReleaseResponse(resp)
			req.SetRequestURI("http://" + client.Addr + path)
			req.Header.SetMethod(fasthttp.MethodPost)
			req.Header.SetContentType("application/json")
			var body []byte
			for {
				b := next.Add(1) - 1
				if b >= int64(o.Buyers) || time.Now().After(stopAt) {
					break
				}
				body = fmt.Appendf(body[:0], `{"user":"u%d","qty":1,"request_id":"%s-%d"}`, b, runID, b)
				req.SetBodyRaw(body)
				t0 := time.Now()
				err := client.Do(req, resp)
				res.lat.Record(time.Since(t0))
				if err != nil {
					res.outcomes["error "+errorClass(err)]++
					continue
				}
				code := resp.StatusCode()
				var answer struct {
					Error   string `json:"error"`
					OrderID string `json:"order_id"`
				}
				_ = json.Unmarshal(resp.Body(), &answer)
				res.outcomes[strconv.Itoa(code)+" "+outcomeName(code, answer.Error)]++
				if (code == 200 || code == 202) && answer.OrderID != "" {
					res.orders = append(res.orders, answer.OrderID)
				}
			}
			results[w] = res
		}(w)
	}
	wg.Wait()
	r := &Report{Options: o, Elapsed: time.Since(start), Outcomes: map[string]int{}}
	all := NewLatencies(0)
	seen := map[string]bool{}
	for _, res := range results {
		all.Merge(res.lat)
		for k, v := range res.outcomes {
			r.Outcomes[k] += v
		}
		for _, id := range res.orders {
			seen[id] = true
		}
	}
	r.Sent = all.Count()
	r.Latency = all.Summarize()
	r.Wins = len(seen)

	counts, err := audit(clients[0], o.SKU, o.AdminToken)
	if err != nil {
		return r, err
	}
	r.Ledger = counts
	r.Oversold = Oversold(int64(r.Wins), counts)
	return r, nil
}

// Oversold is how many units were sold beyond the stock: acknowledged wins
// beyond the total, or a ledger whose sold and held units exceed the total.
func Oversold(wins int64, l LedgerCounts) int64 {
	over := max(wins-l.Total, l.Sold+l.Held-l.Total, 0)
	if !l.OK {
		// A ledger that fails its own audit cannot vouch for anything.
		over = max(over, 1)
	}
	return over
}

func outcomeName(code int, errCode string) string {
	switch {
	case code == 200:
		return "ok"
	case code == 202:
		return "accepted"
	case errCode != "":
		return errCode
	}
	return "other"
}

func errorClass(err error) string {
	switch {
	case errors.Is(err, fasthttp.ErrTimeout):
		return "timeout"
	case errors.Is(err, fasthttp.ErrConnectionClosed):
		return "connection_closed"
	}
	return "transport"
}

func adminRequest(c *fasthttp.HostClient, method, path, token string, body []byte) (int, []byte, error) {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI("http://" + c.Addr + path)
	req.Header.SetMethod(method)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	req.SetBody(body)
	if err := c.DoTimeout(req, resp, requestTimeout); err != nil {
		return 0, nil, err
	}
	return resp.StatusCode(), append([]byte(nil), resp.Body()...), nil
}

func createSale(c *fasthttp.HostClient, o Options) error {
	body := []byte(fmt.Sprintf(`{"total":%d}`, o.Units))
	code, answer, err := adminRequest(c, fasthttp.MethodPut, "/v1/skus/"+o.SKU, o.AdminToken, body)
	if err != nil {
		return fmt.Errorf("create sale %s: %w", o.SKU, err)
	}
	if code != fasthttp.StatusCreated {
		return fmt.Errorf("create sale %s: %d %s (use a new -sku for each run)", o.SKU, code, strings.TrimSpace(string(answer)))
	}
	return nil
}

func waitForSale(c *fasthttp.HostClient, sku string) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		code, body, err := adminRequest(c, fasthttp.MethodGet, "/v1/skus/"+sku, "", nil)
		if err == nil && code == fasthttp.StatusOK {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("sale %s not visible on %s after 10s: %d %s %v", sku, c.Addr, code, body, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func audit(c *fasthttp.HostClient, sku, token string) (LedgerCounts, error) {
	var counts LedgerCounts
	// wait=none answers before commit: give the ledger a bounded while to
	// catch up so the audit sees every won unit.
	deadline := time.Now().Add(30 * time.Second)
	for {
		code, body, err := adminRequest(c, fasthttp.MethodGet, "/v1/skus/"+sku+"/audit", token, nil)
		if err != nil {
			return counts, fmt.Errorf("audit %s: %w", sku, err)
		}
		if code != fasthttp.StatusOK {
			return counts, fmt.Errorf("audit %s: %d %s", sku, code, body)
		}
		counts = LedgerCounts{}
		if err := json.Unmarshal(body, &counts); err != nil {
			return counts, fmt.Errorf("decode audit of %s: %w", sku, err)
		}
		var local struct {
			Local struct {
				TakesInFlight int64 `json:"takes_in_flight"`
			} `json:"local"`
		}
		_ = json.Unmarshal(body, &local)
		if local.Local.TakesInFlight == 0 || time.Now().After(deadline) {
			return counts, nil
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Print writes the human-readable report.
func (r *Report) Print(w io.Writer) {
	o := r.Options
	wait := "commit"
	if o.NoWait {
		wait = "none"
	}
	fmt.Fprintf(w, "stockd bench: flash sale of %d units, %d buyers, %d connections, wait=%s, targets %s\n",
		o.Units, o.Buyers, o.Conns, wait, strings.Join(o.Targets, ","))
	fmt.Fprintf(w, "requests   %d in %s (%.0f req/s)\n", r.Sent, r.Elapsed.Round(time.Millisecond), r.Rate())
	l := r.Latency
	fmt.Fprintf(w, "latency    p50 %s  p99 %s  p99.9 %s  max %s\n", fmtDur(l.P50), fmtDur(l.P99), fmtDur(l.P999), fmtDur(l.Max))
	keys := make([]string, 0, len(r.Outcomes))
	for k := range r.Outcomes {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	fmt.Fprint(w, "outcomes  ")
	for _, k := range keys {
		fmt.Fprintf(w, "  %s: %d", k, r.Outcomes[k])
	}
	fmt.Fprintln(w)
	var leased int64
	for _, v := range r.Ledger.Leased {
		leased += v
	}
	fmt.Fprintf(w, "ledger     total %d  sold %d  held %d  available %d  leased %d  orders %d  audit ok: %v\n",
		r.Ledger.Total, r.Ledger.Sold, r.Ledger.Held, r.Ledger.Available, leased, r.Ledger.Orders, r.Ledger.OK)
	fmt.Fprintf(w, "wins       %d distinct orders acknowledged\n", r.Wins)
	fmt.Fprintf(w, "oversold: %d\n", r.Oversold)
}

func fmtDur(d time.Duration) string {
	switch {
	case d >= time.Second:
		return fmt.Sprintf("%.2fs", d.Seconds())
	case d >= time.Millisecond:
		return fmt.Sprintf("%.2fms", float64(d)/1e6)
	}
	return fmt.Sprintf("%.0fµs", float64(d)/1e3)
}

// tail returns the last n lines of a file, for error messages.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// runLaunched runs the load once per launch size, each against a fresh
// local cluster, with the same client settings, and compares throughput.
func runLaunched(o Options, stdout io.Writer) error {
	bin := o.Binary
	if bin == "" {
		var err error
		if bin, err = os.Executable(); err != nil {
			return fmt.Errorf("find this executable: %w", err)
		}
	}
	var reports []*Report
	for _, n := range o.Launches {
		r, err := runOnFreshCluster(o, bin, n)
		if err != nil {
			return err
		}
		r.Print(stdout)
		fmt.Fprintln(stdout)
		reports = append(reports, r)
		if r.Oversold != 0 {
			return fmt.Errorf("oversold %d units against %d node(s)", r.Oversold, n)
		}
	}
	if len(reports) > 1 {
		base := reports[0]
		fmt.Fprintln(stdout, "comparison (same client, same run):")
		for i, r := range reports {
			fmt.Fprintf(stdout, "  %d node(s): %.0f req/s  p99 %s  x%.2f of the %d-node rate\n",
				o.Launches[i], r.Rate(), fmtDur(r.Latency.P99), r.Rate()/base.Rate(), o.Launches[0])
		}
	}
	return nil
}

func runOnFreshCluster(o Options, bin string, n int) (*Report, error) {
	dir, err := os.MkdirTemp("", "stockd-bench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	nodes, err := launchCluster(bin, dir, n)
	if err != nil {
		return nil, err
	}
	defer func() {
		for _, l := range nodes {
			if err := l.stop(); err != nil {
				fmt.Fprintln(os.Stderr, "stop launched node:", err)
			}
		}
	}()
	o.Targets = nil
	for _, l := range nodes {
		o.Targets = append(o.Targets, l.url)
	}
	return Run(o)
}

// Rate is requests per second over the run.
func (r *Report) Rate() float64 { return float64(r.Sent) / r.Elapsed.Seconds() }
