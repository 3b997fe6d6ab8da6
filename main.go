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
	"path/filepath"
	"runtime"
	"strings"
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
	ID          string
	HTTPAddr    string
	RaftAddr    string
	DataDir     string
	Peers       string
	Join        string
	AdminToken  string
	LogLevel    string
	Buckets     int
	Logger      *slog.Logger
	raftTimeout time.Duration // heartbeat/election; tests shorten it
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
	fs.StringVar(&cfg.LogLevel, "log-level", "info", "debug, info, warn or error")
	fs.IntVar(&cfg.Buckets, "buckets", runtime.GOMAXPROCS(0), "per-core stock buckets per SKU")
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
}

// startNode opens the ledger, wires the engine to it, starts raft and the
// HTTP server. On error everything started is stopped again.
func startNode(cfg nodeConfig) (*runningNode, error) {
	peers, err := parsePeers(cfg.Peers)
	if err != nil {
		return nil, err
	}
	if len(peers) > 1 || cfg.Join != "" {
		return nil, errors.New("multi-node clusters (-peers with several nodes, -join) are not supported by this version yet; run one node")
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	ledger, err := raftfsm.OpenLedger(filepath.Join(cfg.DataDir), logger)
	if err != nil {
		return nil, err
	}
	ecfg := engine.DefaultConfig()
	ecfg.NodeID, ecfg.Logger, ecfg.BucketsPerSKU = cfg.ID, logger, cfg.Buckets
	eng, err := engine.New(ecfg, ledger)
	if err != nil {
		ledger.Close()
		return nil, err
	}
	rcfg := raftfsm.DefaultConfig()
	rcfg.NodeID, rcfg.Dir, rcfg.RaftBind, rcfg.Peers, rcfg.Logger = cfg.ID, cfg.DataDir, cfg.RaftAddr, peers, logger
	if cfg.raftTimeout > 0 {
		rcfg.HeartbeatTimeout, rcfg.ElectionTimeout, rcfg.LeaderLeaseTimeout = cfg.raftTimeout, cfg.raftTimeout, cfg.raftTimeout/2
	}
	rn, err := raftfsm.StartNode(rcfg, ledger)
	if err != nil {
		eng.Close(context.Background())
		ledger.Close()
		return nil, err
	}
	eng.Start(rn)
	hcfg := httpapi.DefaultConfig()
	hcfg.Addr, hcfg.AdminToken, hcfg.Logger = cfg.HTTPAddr, cfg.AdminToken, logger
	srv, err := httpapi.New(hcfg, eng, clusterStatus{rn}, version)
	n := &runningNode{logger: logger, ledger: ledger, raft: rn, engine: eng, http: srv}
	if err == nil {
		var addr fmt.Stringer
		addr, err = srv.Start()
		if err == nil {
			n.httpAddr = addr.String()
			return n, nil
		}
	}
	n.http = nil
	n.stop(context.Background())
	return nil, err
}

// stop drains HTTP, then the engine (queued takes, unused leases), then
// raft and the ledger.
func (n *runningNode) stop(ctx context.Context) error {
	var errs []error
	if n.http != nil {
		if err := n.http.Shutdown(); err != nil {
			errs = append(errs, err)
		}
	}
	if err := n.engine.Close(ctx); err != nil {
		errs = append(errs, err)
	}
	if err := n.raft.Close(); err != nil {
		errs = append(errs, err)
	}
	if err := n.ledger.Close(); err != nil {
		errs = append(errs, fmt.Errorf("close ledger: %w", err))
	}
	if len(errs) == 0 {
		n.logger.Info("stopped cleanly")
	}
	return errors.Join(errs...)
}

// clusterStatus adapts raft's status to the HTTP layer's view.
type clusterStatus struct{ node *raftfsm.Node }

func (c clusterStatus) Status() httpapi.ClusterStatus {
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
