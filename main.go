// Command stockd is a stock engine for flash sales: one binary that serves
// the HTTP API, replicates its ledger with Raft, and benchmarks itself.
//
//	stockd [serve] [flags]   run a node (the default command)
//	stockd bench [flags]     the load harness
//	stockd version
//
// Every serve flag can also be set as STOCKD_<FLAG> in the environment
// (-admin-token as STOCKD_ADMIN_TOKEN); a flag on the command line wins.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"stockd.dev/stockd/backup"
	"stockd.dev/stockd/bench"
	"stockd.dev/stockd/feed"
	"stockd.dev/stockd/internal/health"
	"stockd.dev/stockd/internal/pki"
	"stockd.dev/stockd/internal/procgov"
	"stockd.dev/stockd/node"
	"stockd.dev/stockd/sink"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	cmd := "serve"
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		cmd, args = args[0], args[1:]
	}
	switch cmd {
	case "serve":
		if err := serve(args, stderr); err != nil {
			fmt.Fprintln(stderr, "stockd:", err)
			return 1
		}
		return 0
	case "bench":
		return exitCode(stderr, "stockd bench", bench.Main(args, stdout, stderr))
	case "noop-server":
		// The bench's HTTP floor: a fasthttp server that answers every
		// request with a fixed body. Not for users; stockd bench starts it.
		fs := flag.NewFlagSet("stockd noop-server", flag.ContinueOnError)
		fs.SetOutput(stderr)
		addr := fs.String("http", "127.0.0.1:0", "listen address")
		if err := fs.Parse(args); err != nil {
			return 2
		}
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
		defer stop()
		if err := bench.ServeNoop(ctx, *addr); err != nil {
			fmt.Fprintln(stderr, "stockd noop-server:", err)
			return 1
		}
		return 0
	case "feed":
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
		defer stop()
		return exitCode(stderr, "stockd feed", feed.Main(ctx, args, stdout, stderr))
	case "sink":
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
		defer stop()
		return exitCode(stderr, "stockd sink", sink.Main(ctx, args, stdout, stderr))
	case "reconcile":
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
		defer stop()
		err := sink.Reconcile(ctx, args, stdout, stderr)
		code := exitCode(stderr, "stockd reconcile", err)
		if errors.Is(err, sink.ErrBehind) {
			code = sink.ReconcileBehind
		}
		return code
	case "cert":
		return exitCode(stderr, "stockd cert", pki.Main(args, stdout, stderr))
	case "backup":
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
		defer stop()
		return exitCode(stderr, "stockd backup", backup.Main(ctx, args, stdout, stderr))
	case "health":
		return exitCode(stderr, "stockd health", health.Main(context.Background(), args, stdout, stderr))
	case "restore":
		return exitCode(stderr, "stockd restore", backup.Restore(args, stdout, stderr))
	case "version":
		fmt.Fprintf(stdout, "stockd %s %s\n", version, runtime.Version())
		return 0
	case "help", "-h", "--help":
		fmt.Fprintln(stdout, "usage: stockd [serve] [flags] | stockd bench [flags] | stockd feed -consumer NAME [flags] | stockd sink -db DSN -consumer NAME [flags] | stockd reconcile -db DSN [flags] | stockd cert ca|node|client [flags] | stockd backup -target URL -out FILE | stockd backup verify FILE | stockd restore -from FILE -data DIR -id ID | stockd health [-target URL] | stockd version\nstockd serve -h lists the flags.")
		return 0
	}
	fmt.Fprintf(stderr, "stockd: unknown command %q (serve, bench, feed, cert, backup, restore, health, version)\n", cmd)
	return 2
}

// exitCode is a subcommand's exit status: 0 when it succeeded or only
// printed its usage (-h), else 1 with the error printed.
func exitCode(stderr io.Writer, name string, err error) int {
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	}
	fmt.Fprintln(stderr, name+":", err)
	return 1
}

// parseServeFlags binds the serve flags onto node.DefaultConfig (and the
// parts' defaults inside it), then fills what the command line left unset
// from STOCKD_<FLAG>.
func parseServeFlags(args []string, stderr io.Writer) (node.Config, error) {
	cfg, _, err := parseServeCommand(args, stderr)
	return cfg, err
}

// procsFlag is -procs: auto (procgov governs GOMAXPROCS), 0 (Go's choice,
// one thread a core) or a count of threads, written as a plain number.
type procsFlag struct{ cfg *node.Config }

func (f procsFlag) String() string {
	if f.cfg == nil || f.cfg.ProcsAuto {
		return "auto"
	}
	return strconv.Itoa(f.cfg.Procs)
}

func (f procsFlag) Set(s string) error {
	if s == "auto" {
		f.cfg.ProcsAuto, f.cfg.Procs = true, 0
		return nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 || strconv.Itoa(n) != s {
		return errors.New("want auto, 0 (one thread a core) or a count of threads")
	}
	f.cfg.ProcsAuto, f.cfg.Procs = false, n
	return nil
}

// parseServeCommand is parseServeFlags that also reports -check-config.
func parseServeCommand(args []string, stderr io.Writer) (_ node.Config, checkOnly bool, _ error) {
	cfg := node.DefaultConfig()
	cfg.Version = version
	var peers, logLevel string
	raftTimeout := cfg.Raft.HeartbeatTimeout
	fs := flag.NewFlagSet("stockd serve", flag.ContinueOnError)
	fs.BoolVar(&checkOnly, "check-config", false, "check the flags (and the certificate files they name) and exit: 0 when the node would start, else 1 with the reason; binds nothing, touches no data")
	fs.SetOutput(stderr)
	fs.StringVar(&cfg.ID, "id", cfg.ID, "node id")
	fs.StringVar(&cfg.HTTP.Addr, "http", cfg.HTTP.Addr, "HTTP listen address (clients and peers)")
	fs.StringVar(&cfg.Raft.RaftBind, "raft", cfg.Raft.RaftBind, "Raft transport address")
	fs.StringVar(&cfg.DataDir, "data", cfg.DataDir, "directory for the raft log, snapshots and ledger")
	fs.StringVar(&peers, "peers", "", "initial cluster id=raftaddr,...; omitted: a single-node cluster")
	fs.StringVar(&cfg.Join, "join", "", "join an existing cluster through this node's HTTP URL")
	fs.StringVar(&cfg.HTTP.AdminToken, "admin-token", "", "bearer token required for admin calls (none: admin calls only from loopback)")
	fs.StringVar(&cfg.ClusterSecret, "cluster-secret", "", "shared secret node-to-node calls carry on a loopback cluster without node certificates; required there with -peers or -join")
	fs.StringVar(&cfg.TLS.NodeCert, "node-cert", "", "this node's certificate (PEM; its Common Name is the node id): raft and node-to-node calls on the -raft port over mutually authenticated TLS")
	fs.StringVar(&cfg.TLS.NodeKey, "node-key", "", "the key of -node-cert (PEM)")
	fs.StringVar(&cfg.TLS.NodeCA, "node-ca", "", "the CA bundle (PEM) that signs every member's node certificate")
	fs.StringVar(&cfg.TLS.HTTPCert, "http-cert", "", "serve clients HTTPS with this certificate (PEM; a node certificate will do)")
	fs.StringVar(&cfg.TLS.HTTPKey, "http-key", "", "the key of -http-cert (PEM)")
	fs.StringVar(&cfg.TLS.HTTPClientCA, "http-client-ca", "", "require client certificates signed by this CA bundle (PEM) on every route but /healthz, /readyz and /metrics")
	fs.BoolVar(&cfg.InsecurePlaintextCluster, "insecure-plaintext-cluster", false, "run node-to-node traffic on plain TCP with -cluster-secret although -raft is reachable from other machines")
	fs.StringVar(&cfg.HTTP.ServiceToken, "service-token", "", "bearer token required for deducts, order reads, confirm and cancel (none: open to the service network)")
	fs.BoolVar(&cfg.InsecureNoAdminToken, "insecure-no-admin-token", false, "start without -admin-token although -http is reachable from other machines (admin calls then only from loopback clients)")
	fs.StringVar(&cfg.AdvertiseHTTP, "advertise-http", "", "HTTP address peers use to reach this node (default: the -http address)")
	fs.StringVar(&cfg.Raft.Advertise, "advertise-raft", "", "the node port's address peers dial, host:port (default: this node's address in -peers, else -raft; needed when -raft listens on 0.0.0.0)")
	cfg.ProcsAuto = true
	fs.Var(procsFlag{&cfg}, "procs", "threads that run Go code at once (GOMAXPROCS): auto (one while one keeps up, every core under load), 0 (one a core) or a count: docs/operations.md")
	fs.DurationVar(&cfg.DrainTimeout, "drain-timeout", cfg.DrainTimeout, "on SIGTERM, how long in-flight requests, queued takes and lease returns may take before the node closes")
	fs.DurationVar(&cfg.Engine.LeaseIdleReturn, "lease-idle-return", cfg.Engine.LeaseIdleReturn, "return a sale's unused lease after this long without a sale on this node")
	fs.DurationVar(&cfg.Engine.ReclaimAfter, "reclaim-after", cfg.Engine.ReclaimAfter, "the leader reclaims the leases of a node unreachable this long")
	fs.DurationVar(&cfg.Engine.LeaseWait, "lease-wait", cfg.Engine.LeaseWait, "how long a buyer waits for units held by other nodes before 429 try_again")
	fs.Int64Var(&cfg.Engine.LeaseChunkMax, "lease-chunk-max", cfg.Engine.LeaseChunkMax, "the most units one lease takes in a cluster (a quarter of what is available, up to this; a node alone is not capped): more keeps a node fed by gateways' batches selling from its buckets, less strands fewer units on a node that dies")
	fs.DurationVar(&cfg.Engine.CommitWait, "commit-wait", cfg.Engine.CommitWait, "how long a wait=commit deduct waits for its commit before 504 outcome_unknown")
	fs.IntVar(&cfg.Engine.TakeBatchBytesMax, "take-batch-bytes", cfg.Engine.TakeBatchBytesMax, "the largest Take batch, encoded (at least 1024)")
	fs.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	fs.IntVar(&cfg.Engine.BucketsPerSKU, "buckets", cfg.Engine.BucketsPerSKU, "per-core stock buckets per SKU")
	fs.Float64Var(&cfg.Engine.RateLimit, "rate-limit", cfg.Engine.RateLimit, "deducts per second this node admits (0: no limit); the rest get 429 with Retry-After")
	fs.IntVar(&cfg.Engine.RateBurst, "rate-burst", cfg.Engine.RateBurst, "deducts admitted at once above -rate-limit")
	fs.IntVar(&cfg.Engine.MaxInFlight, "max-inflight", cfg.Engine.MaxInFlight, "deducts served at once on this node (0: no cap); the rest get 429")
	fs.DurationVar(&cfg.Engine.AdmissionLatency, "admission-latency", cfg.Engine.AdmissionLatency, "admission follows the ledger: won deducts waiting for their commit are bounded, and the bound shrinks when they wait longer than this (0: off); the rest get 429 at once")
	fs.DurationVar(&cfg.FaultApplyDelay, "fault-apply-delay", 0, "FOR TESTS AND BENCHES ONLY: stall every ledger batch this long (a slow ledger)")
	fs.IntVar(&cfg.Engine.ProposalsInFlightMax, "proposals-in-flight", cfg.Engine.ProposalsInFlightMax, "Take batches proposed at once while leading; a new batch gathers every win queued meanwhile")
	fs.IntVar(&cfg.Engine.ForwardedInFlightMax, "forwarded-in-flight", cfg.Engine.ForwardedInFlightMax, "Take batches forwarded to the leader at once while following")
	fs.DurationVar(&cfg.Engine.ForwardLinger, "forward-linger", cfg.Engine.ForwardLinger, "how long a following node's Take batch waits for more takes before it is forwarded (0: at once)")
	fs.DurationVar(&cfg.Engine.ProposeLinger, "propose-linger", cfg.Engine.ProposeLinger, "how long the leader's own Take batch waits for more takes before it is proposed (0: at once)")
	fs.DurationVar(&cfg.Engine.RequestRetention, "request-retention", cfg.Engine.RequestRetention, "how long a request_id keeps answering with its first order")
	fs.Int64Var(&cfg.Engine.RequestMaxKeep, "request-max-keep", cfg.Engine.RequestMaxKeep, "most request_ids remembered; the oldest beyond this are forgotten first")
	fs.DurationVar(&cfg.Engine.FeedRetention, "event-retention", cfg.Engine.FeedRetention, "how long the order feed keeps events (longer while a consumer has not acknowledged them)")
	fs.Uint64Var(&cfg.Engine.FeedCap, "event-cap", cfg.Engine.FeedCap, "the most events the order feed keeps, even for a consumer that has not acknowledged them (a warning and stockd_feed_unacknowledged_pruned_events_total when it cuts)")
	fs.StringVar(&cfg.Backups.Dir, "backup-dir", cfg.Backups.Dir, "the leader writes a backup file here every -backup-interval (empty: no scheduled backups)")
	fs.DurationVar(&cfg.Backups.Interval, "backup-interval", cfg.Backups.Interval, "how often the leader writes a scheduled backup")
	fs.IntVar(&cfg.Backups.Keep, "backup-keep", cfg.Backups.Keep, "how many scheduled backups of this node to keep (the newest)")
	fs.BoolVar(&cfg.DeductLoop, "http-event-loop", cfg.DeductLoop, "serve plain single deducts (POST /v1/skus/{sku}/deduct) from one event loop, the rest through fasthttp (Linux); false: fasthttp serves every request (with -http-cert it always does: the loop speaks plain HTTP)")
	fs.BoolVar(&cfg.NoOrderFeed, "no-order-feed", cfg.NoOrderFeed, "record no order feed (for measuring its cost; every node of a cluster must agree from its first start)")
	fs.DurationVar(&cfg.Engine.AuditInterval, "audit-interval", cfg.Engine.AuditInterval, "how often every node audits its ledger (stockd_audit_drift_units); longer on a large ledger, and held back up to 5m while the node sells")
	fs.StringVar(&cfg.Raft.LogStore, "raft-log-store", cfg.Raft.LogStore, "raft log store of a new data dir: wal (append-only segments) or bolt (raft-boltdb); a data dir keeps the one it has")
	fs.DurationVar(&raftTimeout, "raft-timeout", raftTimeout, "raft heartbeat and election timeout (leader lease: half); failover takes about two to three of these")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: stockd [serve] [flags]\n\nEvery flag can also be set as STOCKD_<FLAG> (for -admin-token: STOCKD_ADMIN_TOKEN).")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return cfg, checkOnly, err
	}
	if fs.NArg() > 0 {
		return cfg, checkOnly, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if checkOnly {
		for _, v := range unknownEnv(fs, os.Environ()) {
			fmt.Fprintf(stderr, "stockd: warning: %s matches no flag of stockd serve and is ignored (a renamed flag?)\n", v)
		}
	}
	if err := applyEnv(fs, os.LookupEnv); err != nil {
		return cfg, checkOnly, err
	}
	var err error
	if cfg.Peers, err = parsePeers(peers); err != nil {
		return cfg, checkOnly, err
	}
	if raftTimeout <= 0 {
		return cfg, checkOnly, fmt.Errorf("-raft-timeout %s must be > 0", raftTimeout)
	}
	cfg.Raft.HeartbeatTimeout, cfg.Raft.ElectionTimeout, cfg.Raft.LeaderLeaseTimeout = raftTimeout, raftTimeout, raftTimeout/2
	var level slog.Level
	if err := level.UnmarshalText([]byte(logLevel)); err != nil {
		return cfg, checkOnly, fmt.Errorf("-log-level %q: %w", logLevel, err)
	}
	cfg.Logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	return cfg, checkOnly, nil
}

// applyEnv sets every flag not given on the command line from STOCKD_<FLAG>.
func applyEnv(fs *flag.FlagSet, lookup func(string) (string, bool)) error {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if given[f.Name] || err != nil {
			return
		}
		name := "STOCKD_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if v, ok := lookup(name); ok {
			if serr := fs.Set(f.Name, v); serr != nil {
				err = fmt.Errorf("%s=%q: %w", name, v, serr)
			}
		}
	})
	return err
}

// envNotFlags are STOCKD_ variables other commands read (and every
// STOCKD_SINK_ variable, stockd sink's).
var envNotFlags = map[string]bool{"STOCKD_HEALTH_CA": true}

// unknownEnv lists the STOCKD_ variables in environ that name no flag of
// fs.
func unknownEnv(fs *flag.FlagSet, environ []string) []string {
	known := map[string]bool{}
	fs.VisitAll(func(f *flag.Flag) { known["STOCKD_"+strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))] = true })
	var out []string
	for _, kv := range environ {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "STOCKD_") && !strings.HasPrefix(k, "STOCKD_SINK_") && !known[k] && !envNotFlags[k] {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}

func parsePeers(s string) ([]node.Peer, error) {
	if s == "" {
		return nil, nil
	}
	var peers []node.Peer
	seen := map[string]bool{}
	for _, part := range strings.Split(s, ",") {
		id, addr, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok || id == "" || addr == "" {
			return nil, fmt.Errorf("-peers entry %q: want id=host:port", part)
		}
		if seen[id] {
			return nil, fmt.Errorf("-peers names %q twice", id)
		}
		seen[id] = true
		peers = append(peers, node.Peer{ID: id, Addr: addr})
	}
	return peers, nil
}

func serve(args []string, stderr io.Writer) error {
	cfg, checkOnly, err := parseServeCommand(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	if checkOnly {
		if err := node.CheckConfig(cfg); err != nil {
			return err
		}
		fmt.Fprintf(stderr, "stockd: the configuration of node %s checks out (http %s, raft %s, data %s)\n", cfg.ID, cfg.HTTP.Addr, cfg.Raft.RaftBind, cfg.DataDir)
		return nil
	}
	most := runtime.GOMAXPROCS(0)
	procs := fmt.Sprint(most)
	switch {
	case cfg.ProcsAuto && most > 1:
		ctx, stopGovernor := context.WithCancel(context.Background())
		defer stopGovernor()
		go procgov.Run(ctx, procgov.DefaultPolicy(most), cfg.Logger)
		procs = fmt.Sprintf("auto (1 to %d)", most)
	case cfg.Procs > 0:
		runtime.GOMAXPROCS(cfg.Procs)
		procs = fmt.Sprint(cfg.Procs)
	}
	n, err := node.Start(cfg)
	if err != nil {
		return err
	}
	cfg.Logger.Info("stockd serving", "version", version, "id", cfg.ID, "http", n.HTTPAddr(), "raft", cfg.Raft.RaftBind, "data", cfg.DataDir, "procs", procs)
	scheme := "http"
	if cfg.TLS.HTTPCert != "" {
		scheme = "https"
	}
	fmt.Fprintf(stderr, "stockd: the operator's page is at %s://%s/ui\n", scheme, n.HTTPAddr())

	if err := waitForStop(n, cfg.Logger); err != nil {
		return err
	}
	cfg.Logger.Info("stopping", "drain_timeout", cfg.DrainTimeout)
	start := time.Now()
	err = n.Stop(context.Background())
	if node.Stopped(err) {
		// The stores closed cleanly; a cut-short drain is logged above and
		// loses nothing: unsent takes' units are still leased here.
		cfg.Logger.Info("stopped", "took", time.Since(start).Round(time.Millisecond))
		return nil
	}
	return err
}

// waitForStop returns on SIGTERM or SIGINT, reloading certificates on
// every SIGHUP meanwhile; or with an error once the node broke (it is
// stopped then).
func waitForStop(n *node.Node, logger *slog.Logger) error {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	defer signal.Stop(sig)
	for {
		select {
		case got := <-sig:
			if got != syscall.SIGHUP {
				logger.Info("signal", "signal", got.String())
				return nil
			}
			if err := n.ReloadTLS(); err != nil {
				logger.Error("SIGHUP: some certificates did not reload; those in use stay", "err", err)
			} else {
				logger.Info("SIGHUP: certificates reloaded")
			}
		case <-n.Broken():
			logger.Error("stopping: this process can no longer trust its raft log; restart stockd on the same data dir once the disk can be written")
			n.Stop(context.Background())
			return errors.New("raft log append failed right after a truncation; restart stockd")
		}
	}
}
