package bench

import (
	"crypto/tls"

	"stockd.dev/stockd/client"

	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Limits that keep a run bounded on a small machine.
const (
	maxRequests    = 10_000_000 // latency samples are kept in memory: 80 MB at most
	maxConns       = 4096
	maxRunDuration = 10 * time.Minute
	requestTimeout = 30 * time.Second
)

// Options is one bench run's configuration.
type Options struct {
	Targets []string // stockd node base URLs; empty with Launches
	// TLS checks https:// targets (-ca, -cert, -key); launched TLS
	// clusters set it to their CA's.
	TLS      *tls.Config
	Launches []Launch // launch a local stockd cluster of each kind in turn
	// FeedReader reads the order feed from a stockd row's first node while
	// the row runs, and reports the events per second it got.
	FeedReader bool
	// NoFinalAudit: a stockd row ends by reading each SKU's row instead
	// of its audit, whose recount of every order costs the node time that
	// grows with the ledger (bench-growth.sh audits after it has read the
	// node's CPU).
	NoFinalAudit bool
	Scenarios    []string
	Strategies   []string // empty: all
	Units        int64    // flash, retry-storm, holds: units on sale; hot-cold: per SKU
	Requests     int      // deduct attempts per scenario and strategy
	Conns        int
	Duration     time.Duration // stop sending after this long even if requests remain
	SKUs         int           // hot-cold: number of SKUs
	ZipfS        float64       // hot-cold: Zipf exponent
	RetryShare   float64       // retry-storm: share of requests that re-send an earlier request id
	HoldTTL      time.Duration // holds: hold time
	QueueNever   float64       // queue: share of admitted users who never buy
	QueueTTL     time.Duration // queue: how long an admission lasts
	QueuePoll    time.Duration // queue: a page's long-poll in line, and how often the others read again
	Redis        string        // Redis address for the redis-lua strategy
	RedisWait    int           // replicas each Redis deduct waits for (WAIT), 0: none
	RedisPIDs    []int         // the Redis server processes, whose CPU the row reports
	Postgres     string        // PostgreSQL DSN for the pg-* strategies
	AdminToken   string
	ServiceToken string
	Binary       string   // stockd binary for Launches; default: this executable
	NodeArgs     []string // extra flags for every launched node
	JSONPath     string
	HTMLPath     string
	Progress     bool   // draw a progress bar on stderr
	CPUProfile   string // write the harness's own CPU profile here
}

func parseFlags(args []string, stderr io.Writer) (Options, error) {
	var o Options
	var targets, launch, scenarios, strategies, caFile, certFile, keyFile string
	fs := flag.NewFlagSet("stockd bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&targets, "target", "", "comma-separated stockd node URLs to load, e.g. http://127.0.0.1:8080 (requests are spread over them)")
	fs.StringVar(&launch, "launch", "", "launch local stockd nodes in a temp dir instead of -target, and stop them afterwards: 1, 3, or 1,3 (one node, then a three-node cluster, same load); 1nofeed or 3nofeed launch them with -no-order-feed; a tls suffix (1tls, 3nofeedtls) launches them on node certificates the harness makes, clients on HTTPS; peertls (3peertls) puts only node-to-node traffic on TLS, clients on plain HTTP")
	fs.StringVar(&caFile, "ca", "", "CA bundle (PEM) that checks https:// targets")
	fs.StringVar(&certFile, "cert", "", "client certificate (PEM) for targets that require one (-http-client-ca)")
	fs.StringVar(&keyFile, "key", "", "the key of -cert (PEM)")
	fs.BoolVar(&o.NoFinalAudit, "no-final-audit", false, "end each stockd row by reading its SKUs' rows (sold, held, available, leased) instead of auditing them: the count of oversold units stays, the recount of every order is left to the caller")
	fs.BoolVar(&o.FeedReader, "feed-reader", false, "while each stockd row runs, read the order feed from its first node (long-polling, 1000 events a page) and report the events per second it got")
	fs.StringVar(&scenarios, "scenario", "flash", "comma-separated scenarios, or all: "+strings.Join(scenarioNames, ", ")+"; or overload (what admission does when the ledger is slow: a node of its own with every ledger batch stalled 50ms, sent 600 deducts/s for 4s, with admission following the ledger and with it fixed; it reports answers by kind and their latency); or lottery (-requests entrants enter one lottery of -units, open for -duration, then the draw is timed); or queue (-requests users join a sale of -units behind a waiting room that opens -duration after its creation; at the open each reads its ticket, then buyers follow theirs with long-polls and buy once admitted, -queue-never of them never do; then as many plain committed deducts and sold-out answers: joins/s, the open, the last admission, the time to tell everyone sold_out, fairness, the ETA's error, server CPU a call)")
	fs.Float64Var(&o.QueueNever, "queue-never", 0.1, "queue: the share of admitted users who never buy (their admissions run out and let the next in)")
	fs.DurationVar(&o.QueuePoll, "queue-poll", 15*time.Second, "queue: the long-poll of a ticket in line (the buyer's page's), and how often every other ticket in line is read again (for the ETA's figures)")
	fs.DurationVar(&o.QueueTTL, "queue-ttl", 10*time.Second, "queue: how long an admission lasts (the sale's queue_admit_ttl, at least 1s)")
	fs.StringVar(&strategies, "strategy", "", "comma-separated strategies to run (default: all that can run): "+strings.Join(strategyNames, ", "))
	fs.Int64Var(&o.Units, "units", 1000, "units on sale (hot-cold: per SKU; plentiful: ignored, stock is twice the requests)")
	fs.IntVar(&o.Requests, "requests", 100_000, "deduct attempts per scenario and strategy (distinct buyers, but retry-storm re-sends)")
	fs.IntVar(&o.Conns, "conns", 64, "concurrent connections, one worker each, no pipelining")
	fs.DurationVar(&o.Duration, "duration", 10*time.Second, "stop sending after this long per scenario and strategy, even if requests remain")
	fs.IntVar(&o.SKUs, "skus", 100, "hot-cold: number of SKUs")
	fs.Float64Var(&o.ZipfS, "zipf", 1.1, "hot-cold: Zipf exponent s (> 1) of SKU popularity")
	fs.Float64Var(&o.RetryShare, "retry-share", 0.3, "retry-storm: share of requests that re-send an earlier request_id")
	fs.DurationVar(&o.HoldTTL, "hold-ttl", 2*time.Second, "holds: hold time; winners confirm half, cancel a quarter, let a quarter expire")
	fs.StringVar(&o.Redis, "redis", "", "Redis address (host:port) for the redis-lua strategy; absent: skipped")
	fs.IntVar(&o.RedisWait, "redis-wait", 0, "redis-lua: follow every deduct with WAIT N in the same round trip (a replicated Redis: the answer counts once N replicas hold the write)")
	fs.Func("redis-pids", "redis-lua: comma-separated PIDs of the Redis processes (primary and replicas), whose CPU (from /proc, summed) the row reports as the server's", func(v string) error {
		for _, f := range splitList(v) {
			pid, err := strconv.Atoi(f)
			if err != nil || pid <= 0 {
				return fmt.Errorf("-redis-pids: %q is not a process id", f)
			}
			o.RedisPIDs = append(o.RedisPIDs, pid)
		}
		return nil
	})
	fs.StringVar(&o.Postgres, "postgres", "", "PostgreSQL DSN for pg-optimistic and pg-pessimistic; absent: skipped")
	fs.StringVar(&o.AdminToken, "admin-token", os.Getenv("STOCKD_ADMIN_TOKEN"), "admin token of the target nodes (default $STOCKD_ADMIN_TOKEN)")
	fs.StringVar(&o.ServiceToken, "service-token", os.Getenv("STOCKD_SERVICE_TOKEN"), "service token of the target nodes, sent with deducts and order calls (default $STOCKD_SERVICE_TOKEN)")
	fs.StringVar(&o.Binary, "binary", "", "stockd binary for -launch (default: this executable)")
	fs.Func("node-args", "extra flags for every node -launch starts, space-separated, e.g. \"-lease-chunk-max 8192\"", func(v string) error {
		o.NodeArgs = strings.Fields(v)
		return nil
	})
	fs.StringVar(&o.JSONPath, "json", "", "also write the results as JSON to this file")
	fs.StringVar(&o.HTMLPath, "html", "", "also write a self-contained HTML report with charts to this file")
	fs.StringVar(&o.CPUProfile, "cpuprofile", "", "write the harness's own CPU profile (the client side of the load) to this file")
	fs.BoolVar(&o.Progress, "progress", isTerminal(os.Stderr), "draw a progress bar on stderr (default: when stderr is a terminal)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, `usage: stockd bench [-launch 1|3|1,3 | -target URL,...] [flags]

Measures flash-sale strategies with the same client, the same concurrency
and the same scenario, and checks every strategy's final count for
overselling (oversold must be 0). Strategies: stockd over HTTP (wait=commit
and wait=none), a no-op fasthttp server (the HTTP floor of this machine),
in-process counters (mutex, one atomic, per-core buckets), Redis + Lua
(-redis), PostgreSQL optimistic and pessimistic (-postgres). A strategy
whose server is not given is skipped with a reason.

Scenarios: flash (few units, many buyers), plentiful (stock above demand),
hot-cold (Zipf over many SKUs), retry-storm (re-sent request ids), holds
(stockd only: confirm, cancel or let expire).`)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	for _, t := range splitList(targets) {
		o.Targets = append(o.Targets, strings.TrimRight(t, "/"))
	}
	for _, part := range splitList(launch) {
		nodes, peerTLS := strings.CutSuffix(part, "peertls")
		secure := false
		if !peerTLS {
			nodes, secure = strings.CutSuffix(part, "tls")
		}
		nodes, noFeed := strings.CutSuffix(nodes, "nofeed")
		n, err := strconv.Atoi(nodes)
		if err != nil || (n != 1 && n != 3) {
			return o, fmt.Errorf("-launch %q: each entry must be 1 or 3, optionally followed by nofeed, then tls or peertls (1, 3, 1nofeed, 3tls, 3peertls, ...)", launch)
		}
		o.Launches = append(o.Launches, Launch{Nodes: n, NoFeed: noFeed, TLS: secure, PeerTLS: peerTLS})
	}
	if caFile != "" || certFile != "" {
		var err error
		if o.TLS, err = client.TLSFiles(caFile, certFile, keyFile); err != nil {
			return o, err
		}
	}
	o.Scenarios = splitList(scenarios)
	if len(o.Scenarios) == 1 && o.Scenarios[0] == "all" {
		o.Scenarios = scenarioNames
	}
	o.Strategies = splitList(strategies)
	return o, o.validate()
}

// Launch is one local cluster the harness starts: its size, and whether
// its nodes record the order feed.
type Launch struct {
	Nodes  int
	NoFeed bool
	// TLS launches the nodes on node certificates the harness makes, with
	// HTTPS for its clients.
	TLS bool
	// PeerTLS launches them on node certificates for raft and node-to-node
	// calls only: clients speak plain HTTP (the event loop's door).
	PeerTLS bool
}

func splitList(s string) []string {
	var out []string
	for _, part := range strings.Split(s, ",") {
		if part = strings.TrimSpace(part); part != "" {
			out = append(out, part)
		}
	}
	return out
}

func (o *Options) validate() error {
	switch {
	case len(o.Targets) > 0 && len(o.Launches) > 0:
		return errors.New("-target and -launch exclude each other")
	case o.Units < 1:
		return fmt.Errorf("-units %d < 1", o.Units)
	case o.Requests < 1 || o.Requests > maxRequests:
		return fmt.Errorf("-requests %d outside 1..%d", o.Requests, maxRequests)
	case o.Conns < 1 || o.Conns > maxConns:
		return fmt.Errorf("-conns %d outside 1..%d", o.Conns, maxConns)
	case o.Duration <= 0 || o.Duration > maxRunDuration:
		return fmt.Errorf("-duration %s outside (0, %s]", o.Duration, maxRunDuration)
	case o.SKUs < 1 || o.SKUs > 100_000:
		return fmt.Errorf("-skus %d outside 1..100000", o.SKUs)
	case o.ZipfS <= 1:
		return fmt.Errorf("-zipf %g must be > 1", o.ZipfS)
	case o.RetryShare < 0 || o.RetryShare >= 1:
		return fmt.Errorf("-retry-share %g outside [0, 1)", o.RetryShare)
	case o.QueueNever < 0 || o.QueueNever >= 1:
		return fmt.Errorf("-queue-never %g outside [0, 1)", o.QueueNever)
	case o.QueueTTL < time.Second:
		return fmt.Errorf("-queue-ttl %s must be at least 1s", o.QueueTTL)
	case o.QueuePoll < 100*time.Millisecond || o.QueuePoll > time.Minute:
		return fmt.Errorf("-queue-poll %s outside [100ms, 1m]", o.QueuePoll)
	case o.HoldTTL <= 0:
		return fmt.Errorf("-hold-ttl %s must be > 0", o.HoldTTL)
	}
	for _, t := range o.Targets {
		if !strings.HasPrefix(t, "http://") && !strings.HasPrefix(t, "https://") {
			return fmt.Errorf("-target %q: want http://host:port or https://host:port", t)
		}
	}
	for _, s := range o.Scenarios {
		if !slices.Contains(scenarioNames, s) && s != overloadScenario && s != lotteryScenario && s != queueScenario {
			return fmt.Errorf("-scenario %q: want one of %s, all, %s, %s or %s", s, strings.Join(scenarioNames, ", "), overloadScenario, lotteryScenario, queueScenario)
		}
	}
	for _, s := range o.Strategies {
		if !slices.Contains(strategyNames, s) {
			return fmt.Errorf("-strategy %q: want some of %s", s, strings.Join(strategyNames, ", "))
		}
	}
	return nil
}

func isTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
