package node

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"stockd.dev/stockd/engine"
	"stockd.dev/stockd/engine/control"
	"stockd.dev/stockd/httpapi"
	"stockd.dev/stockd/httpapi/eventloop"
	"stockd.dev/stockd/internal/coarsedeadline"
	"stockd.dev/stockd/peer"
	"stockd.dev/stockd/raftfsm"
	"stockd.dev/stockd/raftnode"
)

// Peer is one voter of a cluster: its node id and raft address.
type Peer = raftnode.Peer

// Config is one node's setup: its identity and the knobs of each part.
// Start copies ID, DataDir and Logger into the parts, so a caller sets
// them once here.
type Config struct {
	ID      string
	DataDir string
	// Peers is the initial cluster, identical on every node; empty: a
	// single node (or one that joins through Join).
	Peers []Peer
	// Join is the HTTP URL of a running member to ask for membership.
	Join string
	// AdvertiseHTTP is the HTTP address peers use to reach this node
	// (default: the bound HTTP address).
	AdvertiseHTTP string
	// TLS names the node's certificates: node certificates for every
	// node-to-node call, HTTPS for clients.
	TLS TLSFiles
	// ClusterSecret authenticates node-to-node calls on a cluster without
	// node certificates (-cluster-secret); empty there, those calls are
	// not served.
	ClusterSecret string
	// InsecurePlaintextCluster lets a node whose raft address other
	// machines reach run without node certificates, on plain TCP and the
	// cluster secret (it logs a warning).
	InsecurePlaintextCluster bool
	// InsecureNoAdminToken lets a node whose HTTP address is not
	// loopback-only start without HTTP.AdminToken (admin calls then come
	// only from loopback clients, or through a reverse proxy on the host).
	InsecureNoAdminToken bool
	// DrainTimeout bounds Stop: in-flight requests, queued takes and
	// lease returns get this long; then the stores close regardless.
	DrainTimeout time.Duration
	// Procs is how many threads run Go code at once (GOMAXPROCS; 0: Go's
	// choice, the machine's cores). stockd serve applies it to its
	// process; Start does not (nodes of one test process share one).
	Procs int
	// ProcsAuto has stockd serve govern GOMAXPROCS between one and Go's
	// choice by the CPU the process uses (internal/procgov); Procs is
	// then 0.
	ProcsAuto bool
	// NoOrderFeed stops recording the order feed (GET /v1/events then
	// answers 503). For measuring what the feed costs: every node of a
	// cluster must run with the same setting from its first start.
	NoOrderFeed bool
	// DeductLoop serves plain single deducts on the HTTP port from one
	// event loop (-http-event-loop, on by default on Linux); every other
	// request goes to the fasthttp server. The loop speaks plain HTTP
	// only: with -http-cert fasthttp serves everything.
	DeductLoop bool
	// FaultApplyDelay stalls every ledger batch this long: a slow ledger,
	// for tests and benches of admission. Never in production.
	FaultApplyDelay time.Duration
	// Backups is the leader's backup schedule (-backup-dir, ...).
	Backups BackupSchedule
	Logger  *slog.Logger
	Version string

	HTTP   httpapi.Config
	Raft   raftnode.Config
	Engine engine.Config

	// StreamLayer and PeerDial carry raft and node-to-node HTTP instead of
	// plain TCP (tests cut links with them).
	StreamLayer raftnode.StreamLayer
	PeerDial    peer.DialFunc
}

// drainTimeoutMax keeps a stop within what a process supervisor waits
// before it kills (systemd's default is 90 s; ours is far below).
const drainTimeoutMax = time.Minute

// DefaultConfig is the embedded default: node n1 on 127.0.0.1:8080 (raft
// on 127.0.0.1:7000), data in ./data, a 10 s drain.
func DefaultConfig() Config {
	cfg := Config{
		ID:           "n1",
		DataDir:      "./data",
		DrainTimeout: 10 * time.Second,
		Version:      "dev",
		Backups:      BackupSchedule{Interval: time.Hour, Keep: 24},
		DeductLoop:   eventloop.Available,
		HTTP:         httpapi.DefaultConfig(),
		Raft:         raftnode.DefaultConfig(),
		Engine:       engine.DefaultConfig(),
	}
	// The node's identity is held here once (ID, DataDir, Peers, Logger);
	// Start hands it to the parts.
	cfg.Raft.NodeID, cfg.Raft.Dir, cfg.Engine.NodeID = "", "", ""
	return cfg
}

// heldByNode names a part's setting that Config holds for every part, if
// one is set: Start fills them in, so a value there would be overwritten.
func (c *Config) heldByNode() string {
	switch {
	case c.Engine.NodeID != "", c.Raft.NodeID != "":
		return "the node id (set Config.ID)"
	case c.Raft.Dir != "":
		return "the data dir (set Config.DataDir)"
	case len(c.Raft.Peers) > 0:
		return "the peers (set Config.Peers)"
	case c.Engine.Logger != nil, c.Raft.Logger != nil, c.HTTP.Logger != nil:
		return "the logger (set Config.Logger)"
	case c.Engine.AdvertiseHTTP != "":
		return "the advertised HTTP address (set Config.AdvertiseHTTP)"
	case c.Engine.Cluster != nil, c.Raft.StreamLayer != nil, c.HTTP.Peers != nil, c.HTTP.Internal != nil, c.HTTP.Backups != nil, c.HTTP.BackupStats != nil, c.HTTP.ClusterID != nil:
		return "the wiring between the parts (Start makes it; tests set Config.StreamLayer)"
	}
	return ""
}

// Validate names the first setting that cannot work. The parts validate
// their own knobs when Start builds them.
func (c *Config) Validate() error {
	if held := c.heldByNode(); held != "" {
		return fmt.Errorf("node: %s is a setting of the node, not of one of its parts", held)
	}
	switch {
	case !validNodeID(c.ID):
		return fmt.Errorf("-id %q: a node id is 1 to %d letters, digits, '.', '_' or '-'", c.ID, nodeIDMaxBytes)
	case c.DataDir == "":
		return errors.New("node: data dir is empty")
	case len(c.Peers) > 0 && c.Join != "":
		return errors.New("-peers and -join exclude each other: -peers forms a new cluster, -join enters a running one")
	case c.DrainTimeout <= 0 || c.DrainTimeout > drainTimeoutMax:
		return fmt.Errorf("node: drain timeout %s outside (0, %s]", c.DrainTimeout, drainTimeoutMax)
	case c.transportProblem() != nil:
		return c.transportProblem()
	case c.Backups.validate() != nil:
		return c.Backups.validate()
	case c.HTTP.AdminToken == "" && !c.InsecureNoAdminToken && !loopbackOnly(c.HTTP.Addr):
		return fmt.Errorf("-http %s is reachable from other machines, so admin calls need -admin-token (or STOCKD_ADMIN_TOKEN); to run without one anyway (admin calls only from loopback clients) pass -insecure-no-admin-token", c.HTTP.Addr)
	}
	return nil
}

// nodeIDMaxBytes keeps order ids (node id, sequence, 64 random bits) within
// the API's 128-byte id limit.
const nodeIDMaxBytes = 64

func validNodeID(id string) bool {
	if id == "" || len(id) > nodeIDMaxBytes {
		return false
	}
	for _, c := range id {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '.', c == '_', c == '-':
		default:
			return false
		}
	}
	return true
}

// loopbackOnly reports whether a listen address accepts loopback clients
// only: its host is a loopback IP or a name that resolves to loopback IPs
// only. An empty host (":8080") or 0.0.0.0 listens on every interface.
func loopbackOnly(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil || host == "" {
		return false
	}
	if ip := net.ParseIP(host); ip != nil {
		return ip.IsLoopback()
	}
	ips, err := net.LookupIP(host)
	if err != nil || len(ips) == 0 {
		return false
	}
	for _, ip := range ips {
		if !ip.IsLoopback() {
			return false
		}
	}
	return true
}

// Node is one running stockd node. Stop ends it; the accessors are for
// tests and tools in this process.
type Node struct {
	cfg      Config
	logger   *slog.Logger
	proposer *Proposer
	ledger   *raftfsm.Ledger
	raft     *raftnode.Node
	engine   *engine.Engine
	control  *control.Plane // the control plane over engine
	http     *httpapi.Server
	httpAddr string
	tls      *nodeTLS
	backups  *backupScheduler // nil: no schedule

	stopOnce sync.Once
	stopErr  error
}

// Start opens the ledger, wires the engine to it, starts raft and the HTTP
// server, and joins a cluster when told to. On error everything started is
// stopped again.
func Start(cfg Config) (*Node, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	httpLn, advertise, err := listenHTTP(&cfg)
	if err != nil {
		return nil, err
	}
	tlsState, err := openTLS(&cfg, logger)
	if err != nil {
		httpLn.Close()
		return nil, err
	}
	// Every way of serving below goes through a coarse-deadline listener
	// (serveHTTP), which enforces the HTTP timeouts itself.
	cfg.HTTP.ListenerTimeouts = true
	ledger, err := raftfsm.OpenLedger(cfg.DataDir, logger)
	if err != nil {
		httpLn.Close()
		tlsState.close()
		return nil, err
	}
	ledger.SetFeed(!cfg.NoOrderFeed)
	ledger.SetApplyDelay(cfg.FaultApplyDelay)
	n := &Node{cfg: cfg, logger: logger, ledger: ledger, tls: tlsState}
	serving := false // then the HTTP server (or its loop) owns httpLn
	fail := func(err error) (*Node, error) {
		if !serving {
			httpLn.Close()
		}
		n.stop(context.Background(), false)
		return nil, err
	}
	view := &clusterView{ledger: ledger}
	ecfg := cfg.Engine
	ecfg.NodeID, ecfg.Logger, ecfg.AdvertiseHTTP, ecfg.Cluster = cfg.ID, logger, advertise, view
	if n.engine, err = engine.New(ecfg, ledger); err != nil {
		return fail(err)
	}
	n.control = newControl(n.engine, ledger)
	rcfg := cfg.Raft
	rcfg.NodeID, rcfg.Dir, rcfg.Peers, rcfg.Logger = cfg.ID, cfg.DataDir, cfg.Peers, logger
	rcfg.StreamLayer, rcfg.NoBootstrap = cfg.StreamLayer, cfg.Join != ""
	for _, p := range cfg.Peers {
		if p.ID == cfg.ID {
			rcfg.Advertise = p.Addr
		}
	}
	pcfg := peer.ClientConfig{Self: cfg.ID, Secret: cfg.ClusterSecret, Resolve: view.httpAddrOf, Dial: cfg.PeerDial, Cluster: ledger.ClusterID}
	if port := tlsState.port; port != nil {
		rcfg.StreamLayer, rcfg.Advertise = port.RaftLayer(), port.RaftLayer().Addr().String()
		pcfg.Resolve, pcfg.Dial = view.raftAddrOf, tlsState.peerDial
	}
	if n.raft, err = raftnode.StartNode(rcfg, ledger); err != nil {
		return fail(err)
	}
	view.node = n.raft
	if tlsState.port != nil {
		tlsState.port.SetMembers(members(n.raft))
	}
	peers := peer.NewClient(pcfg)
	view.peers = peers
	proposer := &Proposer{raft: n.raft, ledger: ledger, peers: peers, logger: logger.With("component", "proposer", "node", cfg.ID)}
	n.proposer = proposer
	service := peer.NewService(peer.ServiceConfig{Secret: cfg.ClusterSecret, TLS: tlsState.port != nil,
		ClusterID: ledger.ClusterID, Node: peerView{view}, Proposals: proposer, Logger: logger})
	hcfg := cfg.HTTP
	hcfg.Logger, hcfg.Peers, hcfg.Internal, hcfg.InternalMaxBodyBytes = logger, nodePeers{peers, service}, service.Handle, peer.MaxBodyBytes
	hcfg.Backups = nodeBackups{ledger: ledger, node: cfg.ID, version: cfg.Version}
	hcfg.ClusterID = ledger.ClusterID
	if cfg.Backups.Dir != "" {
		n.backups = &backupScheduler{sched: cfg.Backups, ledger: ledger, raft: n.raft, node: cfg.ID, version: cfg.Version,
			logger: logger.With("component", "backup", "node", cfg.ID)}
		hcfg.BackupStats = n.backups.stats
	}
	hcfg.ClientCerts, hcfg.TLSExpiries = tlsState.httpCA != nil, tlsState.expiries
	if n.http, err = httpapi.New(hcfg, n.control, view, cfg.Version); err != nil {
		return fail(err)
	}
	n.engine.Start(proposer)
	n.control.Start()
	if n.backups != nil {
		n.backups.start()
	}
	if err := n.serveHTTP(&cfg, tlsState, httpLn); err != nil {
		return fail(err)
	}
	serving = true
	if cfg.Join != "" {
		raftAddr := cmp.Or(rcfg.Advertise, cfg.Raft.RaftBind)
		if err := joinCluster(cfg, raftAddr, tlsState.joinTLS(cfg.Join), n.raft.Status().Voters, ledger, logger); err != nil {
			return fail(err)
		}
	}
	return n, nil
}

// listenHTTP binds the HTTP address first: with port 0 (tests) the
// address is known only then, and the engine registers it in the ledger,
// as advertised, for forwarding.
func listenHTTP(cfg *Config) (net.Listener, string, error) {
	ln, err := net.Listen("tcp", cfg.HTTP.Addr)
	if err != nil {
		return nil, "", fmt.Errorf("listen for http on %s: %w", cfg.HTTP.Addr, err)
	}
	return ln, cmp.Or(cfg.AdvertiseHTTP, advertisedHTTP(ln.Addr().String(), cfg.Raft.RaftBind)), nil
}

// serveHTTP starts serving clients on raw and peers on the node port's
// HTTP listener. With -http-event-loop the loop accepts on raw and
// fasthttp serves what it hands over, through the coarse timeouts; else
// fasthttp serves raw, through them and TLS when configured.
func (n *Node) serveHTTP(cfg *Config, tlsState *nodeTLS, raw net.Listener) error {
	if tlsState.port != nil {
		n.http.ServePeers(tlsState.port.HTTPListener())
	}
	loop := cfg.DeductLoop
	if loop && cfg.TLS.HTTPCert != "" {
		loop = false
		n.logger.Info("the deduct event loop is off: it serves plain HTTP, and -http-cert serves HTTPS")
	}
	ln := raw
	if loop {
		h := cfg.HTTP
		front, handed, err := eventloop.Serve(raw.(*net.TCPListener), eventloop.Config{ // listenHTTP's
			Engine: n.engine, Credentials: n.http.Credentials(), MaxConns: h.MaxConns,
			ReadTimeout: h.ReadTimeout, WriteTimeout: h.WriteTimeout, IdleTimeout: h.IdleTimeout,
			Logger: n.logger, Observe: n.http.ObserveDeduct,
		})
		if err != nil {
			return err
		}
		n.http.SetFrontDoor(front)
		ln = handed
	}
	// Client TLS, when configured (never with the loop), goes on top.
	ln = tlsState.clientListener(coarseListener(ln, cfg.HTTP))
	n.http.Serve(ln)
	n.httpAddr = ln.Addr().String()
	return nil
}

// coarseListener wraps the HTTP listener, beneath TLS (whose connections
// pass their deadlines down), so that a deadline is an atomic store to set,
// swept twice a second; it also enforces cfg's HTTP timeouts itself (Start
// tells fasthttp so, through cfg.ListenerTimeouts: it then sets no
// deadline and reads the clock for none). Its sweeper ends when it is
// closed and its connections are.
func coarseListener(ln net.Listener, cfg httpapi.Config) net.Listener {
	return coarsedeadline.Wrap(ln, coarsedeadline.DefaultGranularity).Enforce(coarsedeadline.Timeouts{
		Read: cfg.ReadTimeout, Write: cfg.WriteTimeout, Idle: cfg.IdleTimeout})
}

// advertisedHTTP is the bound HTTP address, with the raft host in place of
// an unspecified one (0.0.0.0 or ::) so peers get a dialable address.
func advertisedHTTP(bound, raftBind string) string {
	host, port, err := net.SplitHostPort(bound)
	if err != nil || !net.ParseIP(host).IsUnspecified() {
		return bound
	}
	raftHost, _, _ := net.SplitHostPort(raftBind)
	return net.JoinHostPort(raftHost, port)
}

// HTTPAddr is the address the HTTP server listens on.
func (n *Node) HTTPAddr() string { return n.httpAddr }

// Broken closes when the node must stop and be restarted (its raft log
// failed in a way raft does not recover from in place; the error is
// logged). stockd serve exits non-zero then, for its supervisor to
// restart it.
func (n *Node) Broken() <-chan struct{} { return n.raft.Broken() }

// Raft returns the node's raft member.
func (n *Node) Raft() *raftnode.Node { return n.raft }

// Engine returns the node's engine.
func (n *Node) Engine() *engine.Engine { return n.engine }

// Proposer returns the node's way into the log (what its engine uses).
func (n *Node) Proposer() *Proposer { return n.proposer }

// Ledger returns the node's ledger.
func (n *Node) Ledger() *raftfsm.Ledger { return n.ledger }

// Stop drains the node within its DrainTimeout (or ctx, if sooner): new
// deducts are refused at once, in-flight requests are answered, queued
// takes committed and unused leases returned where a quorum allows; then
// raft and the ledger close. Safe to call more than once.
func (n *Node) Stop(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, n.cfg.DrainTimeout)
	defer cancel()
	return n.stop(ctx, true)
}

// Crash stops the node without draining, as when the process dies: no
// lease is returned and queued takes are dropped (tests).
func (n *Node) Crash() {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	n.stop(ctx, false)
}

func (n *Node) stop(ctx context.Context, drain bool) error {
	n.stopOnce.Do(func() { n.stopErr = n.stopAll(ctx, drain) })
	return n.stopErr
}

func (n *Node) stopAll(ctx context.Context, drain bool) error {
	var errs []error
	if n.engine != nil {
		n.engine.BeginDrain()
	}
	if !drain && n.raft != nil {
		// A crash: raft goes first, so nothing more reaches the log.
		n.raft.Close()
	}
	if n.http != nil {
		if err := n.http.Shutdown(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	if n.control != nil {
		n.control.Close()
	}
	if n.engine != nil {
		if err := n.engine.Close(ctx); err != nil && drain {
			errs = append(errs, err)
			n.logger.Warn("drain incomplete", "err", err)
		}
	}
	if n.raft != nil && drain {
		if n.raft.IsLeader() && len(n.raft.Status().Voters) > 1 && ctx.Err() == nil {
			if err := n.raft.TransferLeadership(); err != nil {
				n.logger.Warn("leadership transfer before stopping failed", "err", err)
			}
		}
		if err := n.raft.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	n.tls.close()
	if n.backups != nil {
		n.backups.close() // before the ledger: a backup in progress reads it
	}
	if err := n.ledger.Close(); err != nil {
		errs = append(errs, fmt.Errorf("close ledger: %w", err))
	}
	if len(errs) == 0 && drain {
		n.logger.Info("stopped cleanly")
	}
	return errors.Join(errs...)
}

// Stopped reports whether err from Stop still means an orderly stop: the
// stores closed, only the drain was cut short (engine.ErrDrainIncomplete).
func Stopped(err error) bool {
	if err == nil {
		return true
	}
	var joined interface{ Unwrap() []error }
	if errors.As(err, &joined) {
		for _, e := range joined.Unwrap() {
			if !errors.Is(e, engine.ErrDrainIncomplete) {
				return false
			}
		}
		return true
	}
	return errors.Is(err, engine.ErrDrainIncomplete)
}

// nodeBackups takes backups of the node's ledger in its name.
type nodeBackups struct {
	ledger        *raftfsm.Ledger
	node, version string
}

func (b nodeBackups) BeginBackup() (httpapi.Backup, error) {
	bk, err := b.ledger.BeginBackup(b.node, b.version)
	if err != nil {
		return nil, err // not a nil *store.Backup in an interface
	}
	return bk, nil
}

// newControl is the control plane over e, which also hears the ledger's
// events (after the engine).
func newControl(e *engine.Engine, ledger *raftfsm.Ledger) *control.Plane {
	p := control.New(e, ledger)
	ledger.SetObserver(observers{e, queueObserver{p}})
	return p
}

// observers hands the ledger's events to each in turn (raftfsm.Observer):
// a node's are the engine's, then the control plane's waiting-room
// long-polls.
type observers []raftfsm.Observer

func (o observers) Applied(events []raftfsm.Event) {
	for _, x := range o {
		x.Applied(events)
	}
}

// queueObserver is the control plane's waiting room as an observer.
type queueObserver struct{ p *control.Plane }

func (q queueObserver) Applied(events []raftfsm.Event) { q.p.QueueApplied(events) }
