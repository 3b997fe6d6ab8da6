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
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"stockd/bench"
	"stockd/engine"
	"stockd/httpapi"
	"stockd/raftfsm"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

// shutdownTimeout bounds the drain on SIGTERM: in-flight requests, queued
// takes, returning leases.
const shutdownTimeout = 15 * time.Second

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
		if err := bench.Main(args, stdout, stderr); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return 0
			}
			fmt.Fprintln(stderr, "stockd bench:", err)
			return 1
		}
		return 0
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
	case "version":
		fmt.Fprintf(stdout, "stockd %s %s\n", version, runtime.Version())
		return 0
	case "help", "-h", "--help":
		fmt.Fprintln(stdout, "usage: stockd [serve] [flags] | stockd bench [flags] | stockd version\nstockd serve -h lists the flags.")
		return 0
	}
	fmt.Fprintf(stderr, "stockd: unknown command %q (serve, bench, version)\n", cmd)
	return 2
}

// nodeConfig is everything a node needs, gathered from flags and env.
type nodeConfig struct {
	ID                string
	HTTPAddr          string
	AdvertiseHTTP     string
	RaftAddr          string
	DataDir           string
	Peers             string
	Join              string
	AdminToken        string
	ClusterSecret     string
	LogLevel          string
	Buckets           int
	LeaseIdleReturn   time.Duration
	ReclaimAfter      time.Duration
	RaftTimeout       time.Duration // raft heartbeat and election timeout
	ProposalsInFlight int
	RateLimit         float64
	RateBurst         int
	MaxInFlight       int
	RequestRetention  time.Duration
	RequestMaxKeep    int64
	AuditInterval     time.Duration
	Logger            *slog.Logger

	// Test hooks: links between nodes that a test can cut.
	streamLayer raftfsm.StreamLayer
	peerDial    httpapi.DialFunc
}

func parseServeFlags(args []string, stderr io.Writer) (nodeConfig, error) {
	cfg := nodeConfig{}
	fs := flag.NewFlagSet("stockd serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&cfg.ID, "id", "n1", "node id")
	fs.StringVar(&cfg.HTTPAddr, "http", "127.0.0.1:8080", "HTTP listen address (clients and peers)")
	fs.StringVar(&cfg.RaftAddr, "raft", "127.0.0.1:7000", "Raft transport address")
	fs.StringVar(&cfg.DataDir, "data", "./data", "directory for the raft log, snapshots and ledger")
	fs.StringVar(&cfg.Peers, "peers", "", "initial cluster id=raftaddr,...; omitted: a single-node cluster")
	fs.StringVar(&cfg.Join, "join", "", "join an existing cluster through this node's HTTP URL")
	fs.StringVar(&cfg.AdminToken, "admin-token", "", "bearer token required for admin calls (none: admin calls only from loopback)")
	fs.StringVar(&cfg.ClusterSecret, "cluster-secret", "", "shared secret for node-to-node calls (none: accepted only from cluster members' addresses)")
	fs.StringVar(&cfg.AdvertiseHTTP, "advertise-http", "", "HTTP address peers use to reach this node (default: the -http address)")
	fs.DurationVar(&cfg.LeaseIdleReturn, "lease-idle-return", time.Second, "return a sale's unused lease after this long without a sale on this node")
	fs.DurationVar(&cfg.ReclaimAfter, "reclaim-after", 10*time.Second, "the leader reclaims the leases of a node unreachable this long")
	fs.StringVar(&cfg.LogLevel, "log-level", "info", "debug, info, warn or error")
	fs.IntVar(&cfg.Buckets, "buckets", runtime.GOMAXPROCS(0), "per-core stock buckets per SKU")
	fs.Float64Var(&cfg.RateLimit, "rate-limit", 0, "deducts per second this node admits (0: no limit); the rest get 429 with Retry-After")
	fs.IntVar(&cfg.RateBurst, "rate-burst", 1000, "deducts admitted at once above -rate-limit")
	fs.IntVar(&cfg.MaxInFlight, "max-inflight", 10_000, "deducts served at once on this node (0: no cap); the rest get 429")
	fs.IntVar(&cfg.ProposalsInFlight, "proposals-in-flight", 1, "Take batches proposed at once; a new batch gathers every win queued meanwhile")
	fs.DurationVar(&cfg.RequestRetention, "request-retention", 24*time.Hour, "how long a request_id keeps answering with its first order")
	fs.Int64Var(&cfg.RequestMaxKeep, "request-max-keep", 1_000_000, "most request_ids remembered; the oldest beyond this are forgotten first")
	fs.DurationVar(&cfg.AuditInterval, "audit-interval", 30*time.Second, "how often every node audits its ledger (stockd_audit_drift_units)")
	fs.DurationVar(&cfg.RaftTimeout, "raft-timeout", 500*time.Millisecond, "raft heartbeat and election timeout (leader lease: half); failover takes about two to three of these")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: stockd [serve] [flags]\n\nEvery flag can also be set as STOCKD_<FLAG> (for -admin-token: STOCKD_ADMIN_TOKEN).")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if err := applyEnv(fs, os.LookupEnv); err != nil {
		return cfg, err
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(cfg.LogLevel)); err != nil {
		return cfg, fmt.Errorf("-log-level %q: %w", cfg.LogLevel, err)
	}
	cfg.Logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	return cfg, nil
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

func parsePeers(s string) ([]raftfsm.Peer, error) {
	if s == "" {
		return nil, nil
	}
	var peers []raftfsm.Peer
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
		peers = append(peers, raftfsm.Peer{ID: id, Addr: addr})
	}
	return peers, nil
}

func serve(args []string, stderr io.Writer) error {
	cfg, err := parseServeFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	n, err := startNode(cfg)
	if err != nil {
		return err
	}
	cfg.Logger.Info("stockd serving", "version", version, "id", cfg.ID, "http", n.httpAddr, "raft", cfg.RaftAddr, "data", cfg.DataDir)

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	got := <-sig
	cfg.Logger.Info("stopping", "signal", got.String())
	ctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	return n.stop(ctx)
}

// runningNode is one stockd node: ledger, raft, engine and HTTP server.
type runningNode struct {
	logger   *slog.Logger
	ledger   *raftfsm.Ledger
	raft     *raftfsm.Node
	engine   *engine.Engine
	http     *httpapi.Server
	httpAddr string

	stopOnce sync.Once
	stopErr  error
}

// startNode opens the ledger, wires the engine to it, starts raft and the
// HTTP server. On error everything started is stopped again.
func startNode(cfg nodeConfig) (*runningNode, error) {
	peers, err := parsePeers(cfg.Peers)
	if err != nil {
		return nil, err
	}
	if len(peers) > 0 && cfg.Join != "" {
		return nil, errors.New("-peers and -join exclude each other: -peers forms a new cluster, -join enters a running one")
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	// Bind HTTP first: with port 0 (tests) the address is known only now,
	// and the engine registers it in the ledger for forwarding.
	hcfg := httpapi.DefaultConfig()
	hcfg.Addr, hcfg.AdminToken, hcfg.ClusterSecret, hcfg.Logger, hcfg.PeerDial = cfg.HTTPAddr, cfg.AdminToken, cfg.ClusterSecret, logger, cfg.peerDial
	httpLn, err := net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		return nil, fmt.Errorf("listen for http on %s: %w", cfg.HTTPAddr, err)
	}
	advertiseHTTP := cfg.AdvertiseHTTP
	if advertiseHTTP == "" {
		advertiseHTTP = httpLn.Addr().String()
		if host, port, _ := net.SplitHostPort(advertiseHTTP); net.ParseIP(host).IsUnspecified() {
			raftHost, _, _ := net.SplitHostPort(cfg.RaftAddr)
			advertiseHTTP = net.JoinHostPort(raftHost, port)
		}
	}

	ledger, err := raftfsm.OpenLedger(cfg.DataDir, logger)
	if err != nil {
		httpLn.Close()
		return nil, err
	}
	n := &runningNode{logger: logger, ledger: ledger}
	fail := func(err error) (*runningNode, error) {
		httpLn.Close()
		n.stop(context.Background())
		return nil, err
	}
	rcfg := raftfsm.DefaultConfig()
	rcfg.NodeID, rcfg.Dir, rcfg.RaftBind, rcfg.Peers, rcfg.Logger = cfg.ID, cfg.DataDir, cfg.RaftAddr, peers, logger
	rcfg.StreamLayer, rcfg.NoBootstrap = cfg.streamLayer, cfg.Join != ""
	for _, p := range peers {
		if p.ID == cfg.ID {
			rcfg.Advertise = p.Addr
		}
	}
	if cfg.RaftTimeout > 0 {
		rcfg.HeartbeatTimeout, rcfg.ElectionTimeout, rcfg.LeaderLeaseTimeout = cfg.RaftTimeout, cfg.RaftTimeout, cfg.RaftTimeout/2
	}
	cluster := &clusterAdapter{}
	ecfg := engine.DefaultConfig()
	ecfg.NodeID, ecfg.Logger, ecfg.BucketsPerSKU, ecfg.AdvertiseHTTP, ecfg.Cluster = cfg.ID, logger, cfg.Buckets, advertiseHTTP, cluster
	if cfg.LeaseIdleReturn > 0 {
		ecfg.LeaseIdleReturn = cfg.LeaseIdleReturn
	}
	if cfg.ReclaimAfter > 0 {
		ecfg.ReclaimAfter = cfg.ReclaimAfter
	}
	ecfg.RateLimit, ecfg.RateBurst, ecfg.MaxInFlight = cfg.RateLimit, cfg.RateBurst, cfg.MaxInFlight
	if cfg.ProposalsInFlight > 0 {
		ecfg.ProposalsInFlightMax = cfg.ProposalsInFlight
	}
	if cfg.RequestRetention > 0 {
		ecfg.RequestRetention = cfg.RequestRetention
	}
	if cfg.RequestMaxKeep > 0 {
		ecfg.RequestMaxKeep = cfg.RequestMaxKeep
	}
	if cfg.AuditInterval > 0 {
		ecfg.AuditInterval = cfg.AuditInterval
	}
	if n.engine, err = engine.New(ecfg, ledger); err != nil {
		return fail(err)
	}
	if n.raft, err = raftfsm.StartNode(rcfg, ledger); err != nil {
		return fail(err)
	}
	cluster.node = n.raft
	if n.http, err = httpapi.New(hcfg, n.engine, cluster, version); err != nil {
		return fail(err)
	}
	n.engine.Start(n.http.Forwarder())
	n.http.Serve(httpLn)
	n.httpAddr = httpLn.Addr().String()
	if cfg.Join != "" {
		if err := joinCluster(cfg, n.raft.Status().Voters, logger); err != nil {
			return fail(err)
		}
	}
	return n, nil
}

// joinAttemptsTimeout bounds how long -join keeps asking the cluster.
const joinAttemptsTimeout = time.Minute

// joinCluster asks a running cluster (through any member's HTTP URL) to
// add this node as a voter, unless it already is one.
func joinCluster(cfg nodeConfig, voters []raftfsm.Peer, logger *slog.Logger) error {
	for _, v := range voters {
		if v.ID == cfg.ID {
			return nil // restarted on its data dir: already a member
		}
	}
	body, _ := json.Marshal(map[string]string{"id": cfg.ID, "raft_addr": cfg.RaftAddr})
	headers := map[string]string{}
	if cfg.AdminToken != "" {
		headers["Authorization"] = "Bearer " + cfg.AdminToken
	}
	if cfg.ClusterSecret != "" {
		headers["X-Stockd-Cluster-Secret"] = cfg.ClusterSecret
	}
	deadline := time.Now().Add(joinAttemptsTimeout)
	for {
		code, answer, err := httpapi.PostJSON(strings.TrimRight(cfg.Join, "/")+"/v1/cluster/join", body, headers, 10*time.Second)
		if err == nil && code == 200 {
			logger.Info("joined cluster", "via", cfg.Join)
			return nil
		}
		if err == nil && code >= 400 && code < 500 {
			return fmt.Errorf("join through %s: %d %s", cfg.Join, code, answer)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("join through %s: gave up after %s (last: %d %s %v)", cfg.Join, joinAttemptsTimeout, code, answer, err)
		}
		logger.Warn("join not accepted yet; retrying", "via", cfg.Join, "code", code, "err", err)
		time.Sleep(time.Second)
	}
}

// stop drains HTTP, then the engine (queued takes, unused leases), then
// raft and the ledger.
func (n *runningNode) stop(ctx context.Context) error {
	n.stopOnce.Do(func() { n.stopErr = n.stopAll(ctx) })
	return n.stopErr
}

func (n *runningNode) stopAll(ctx context.Context) error {
	var errs []error
	if n.http != nil {
		if err := n.http.Shutdown(); err != nil {
			errs = append(errs, err)
		}
	}
	if n.engine != nil {
		if err := n.engine.Close(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	if n.raft != nil {
		if err := n.raft.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	if err := n.ledger.Close(); err != nil {
		errs = append(errs, fmt.Errorf("close ledger: %w", err))
	}
	if len(errs) == 0 {
		n.logger.Info("stopped cleanly")
	}
	return errors.Join(errs...)
}

// clusterAdapter gives the engine and the HTTP layer their views of raft.
// node is set once raft runs, before either uses it.
type clusterAdapter struct{ node *raftfsm.Node }

func (c *clusterAdapter) IsLeader() bool                     { return c.node.IsLeader() }
func (c *clusterAdapter) CommitHealthy() bool                { return c.node.CommitHealthy() }
func (c *clusterAdapter) Unreachable() map[string]time.Time  { return c.node.Unreachable() }
func (c *clusterAdapter) AddVoter(id, raftAddr string) error { return c.node.AddVoter(id, raftAddr) }
func (c *clusterAdapter) RemoveServer(id string) error       { return c.node.RemoveServer(id) }

func (c *clusterAdapter) MemberIDs() ([]string, error) {
	members, err := c.node.Members()
	if err != nil {
		return nil, err
	}
	ids := make([]string, len(members))
	for i, m := range members {
		ids[i] = m.ID
	}
	return ids, nil
}

// ProposeLocal proposes on this node's raft and maps raft's sentinels onto
// the engine's.
func (c *clusterAdapter) ProposeLocal(cmd *engine.Command) (*engine.Result, error) {
	res, err := c.node.Propose(cmd)
	switch {
	case err == nil:
		return res, nil
	case errors.Is(err, raftfsm.ErrOutcomeUnknown):
		return nil, fmt.Errorf("%w: %w", engine.ErrOutcomeUnknown, err)
	default:
		return nil, fmt.Errorf("%w: %w", engine.ErrUnavailable, err)
	}
}

func (c *clusterAdapter) Status() httpapi.ClusterStatus {
	st := c.node.Status()
	out := httpapi.ClusterStatus{
		NodeID: st.ID, State: st.State, Leader: st.LeaderID, Term: st.Term,
		CommitIndex: st.CommitIndex, AppliedIndex: st.AppliedIndex, LedgerIndex: st.LedgerIndex,
	}
	if !st.LastContact.IsZero() {
		out.LastContact = st.LastContact.UTC().Format(time.RFC3339Nano)
	}
	for _, v := range st.Voters {
		out.Nodes = append(out.Nodes, httpapi.NodeStatus{ID: v.ID, RaftAddr: v.Addr})
	}
	return out
}
