// Package httpapi serves stockd's v1 HTTP contract with
// fasthttp: routing, the JSON wire format, admin auth, metrics and health.
//
// The deduct handler is the hot path: it parses the body with a pooled
// fastjson parser, calls the engine with byte slices that point into the
// request, and writes a precomputed or appended body, so a rejected buyer
// costs no allocation. Everything else uses encoding/json.
package httpapi

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"stockd.dev/stockd/engine/control"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/pprofhandler"

	"stockd.dev/stockd/engine"
	"stockd.dev/stockd/httpapi/deductwire"
	"stockd.dev/stockd/stock"
)

// Limits of the wire format, each with its reason.
const (
	// maxSaleUnits bounds total and restock so sums stay far from overflow.
	maxSaleUnits = 1 << 40
)

// Engine is what the HTTP layer needs from the engine. *engine.Engine
// implements it; handler tests use fakes.
type Engine interface {
	Deduct(req *engine.DeductRequest, res *engine.DeductResult)
	// DeductBatch runs each of reqs as Deduct would, into res.
	DeductBatch(reqs []engine.DeductRequest, res []engine.DeductResult)
	CreateSale(sku string, spec control.SaleSpec) (bool, error)
	Restock(sku string, qty int64) error
	CloseSale(sku string) error
	ArchiveSale(sku string) error
	SKU(sku string) (engine.SKUView, bool)
	SKUViews() []engine.SKUView
	SaleOrders(sku, state, after string, fn func(*stock.Order) error) (stock.OrdersSnapshot, error)
	Order(id string) (stock.Order, bool, error)
	// OrderOwner is the node that minted order id, or "".
	OrderOwner(id string) string
	Confirm(id string) (stock.Order, error)
	Cancel(id string) (stock.Order, error)
	Audit(sku string) (stock.Audit, engine.LocalAudit, bool, error)
	Reclaim(node string) (int64, error)
	MetricsSnapshot() engine.Snapshot
	NodeAddrs() map[string]string
	CommitBlocked() bool
	// LeaderReachable reports whether this node is in contact with a
	// leader (reads are then current, not stale).
	LeaderReachable() bool
	// AppliedIndex is the last log index this node's ledger holds;
	// WaitApplied blocks until it reaches index or ctx ends.
	AppliedIndex() uint64
	WaitApplied(ctx context.Context, index uint64) error
	// CatchUp returns once this node's ledger holds every write the
	// cluster acknowledged before the call, or an error saying why not.
	CatchUp(ctx context.Context) error
	// ReadFresh makes the ledger fit for a read: holding every write this
	// node answered, or (linearizable) every write the cluster
	// acknowledged before the call.
	ReadFresh(ctx context.Context, linearizable bool) error
	// Vouch returns once this node may answer from its own ledger as if
	// every acknowledged write were in it (caughtUp: it caught up first,
	// read again), or an error when it cannot.
	Vouch() (caughtUp bool, err error)
	// The order feed.
	Events(ctx context.Context, after stock.Cursor, limit int, wait time.Duration) (stock.FeedPage, error)
	Feed() (control.FeedView, error)
	AckConsumer(name string, c stock.Cursor) error
	AdvanceConsumer(name string, c stock.Cursor) (moved bool, err error)
	DropConsumer(name string) error
	// Lottery sales.
	Enter(ctx context.Context, sku, user, requestID string) (stock.Entry, error)
	EntryStatus(sku, user string) (stock.EntryStatus, *stock.Order, bool, error)
	SaleEntries(sku string, fn func(*stock.Entry) error) (uint64, error)
	// Sales behind a waiting room.
	QueueEngine
}

// ClusterStatus is a node's view of the cluster for /v1/cluster and /readyz.
type ClusterStatus struct {
	NodeID       string `json:"node_id"`
	State        string `json:"state"`
	Leader       string `json:"leader"`
	Term         uint64 `json:"term"`
	CommitIndex  uint64 `json:"commit_index"`
	AppliedIndex uint64 `json:"applied_index"`
	LedgerIndex  uint64 `json:"ledger_index"`
	LastContact  string `json:"last_contact,omitempty"`
	// LedgerRules are the rules the ledger applies entries under now;
	// RulesKnown the newest this node's binary applies (raftfsm.Rules*).
	// The leader switches the ledger to newer rules once every voter
	// knows them; a node of a version before rules reports neither.
	LedgerRules uint64       `json:"ledger_rules"`
	RulesKnown  uint64       `json:"rules_known"`
	Nodes       []NodeStatus `json:"nodes"`
}

// NodeStatus is one member of the cluster.
type NodeStatus struct {
	ID           string `json:"id"`
	RaftAddr     string `json:"raft_addr"`
	HTTPAddr     string `json:"http_addr,omitempty"`
	Reachable    bool   `json:"reachable"`
	State        string `json:"state,omitempty"`
	Term         uint64 `json:"term,omitempty"`
	CommitIndex  uint64 `json:"commit_index,omitempty"`
	AppliedIndex uint64 `json:"applied_index,omitempty"`
	RulesKnown   uint64 `json:"rules_known,omitempty"`
}

// Cluster reports raft state. It may be nil (tests).
type Cluster interface {
	// Status is this node's own view; Nodes lists the voters' ids and raft
	// addresses.
	Status() ClusterStatus
	IsLeader() bool
	AddVoter(id, raftAddr string) error
	RemoveServer(id string) error
	// LeaderReadIndex is, on the leader, an index every write the cluster
	// acknowledged before the call has reached; an error elsewhere.
	LeaderReadIndex(ctx context.Context) (uint64, error)
}

// Config holds the server's knobs.
type Config struct {
	Addr       string
	AdminToken string // empty: admin calls only from loopback clients
	// ServiceToken, when set, is required (as a bearer token) by the routes
	// a shop's backend calls: deducts, orders, confirm and cancel.
	ServiceToken string
	Logger       *slog.Logger
	ReadTimeout  time.Duration
	WriteTimeout time.Duration
	IdleTimeout  time.Duration
	// ListenerTimeouts: the listener Serve is given enforces the three
	// timeouts above itself (coarsedeadline.Listener.Enforce), so fasthttp
	// is given none and reads the clock for none: four clock reads a
	// request fewer. The node port's server (ServePeers) keeps its own.
	ListenerTimeouts bool
	// MaxConns bounds concurrent client connections.
	MaxConns int
	// ClientCerts: the listener checks client certificates against a CA
	// (-http-client-ca); every route but the probes needs one.
	ClientCerts bool
	// TLSExpiries, when set, lists the expiry of each certificate in use
	// (for /metrics and the operator's page).
	TLSExpiries func() []CertExpiry
	// Peers carries this node's calls to other nodes and tells a peer's
	// request (peer.Client and peer.Service); nil: a node alone, which
	// relays nothing and hears no peer.
	Peers Peers
	// Internal serves the node-to-node routes (RouteInternal and below:
	// peer.Service.Handle); nil answers them 404.
	Internal fasthttp.RequestHandler
	// InternalMaxBodyBytes is the internal routes' own body cap
	// (peer.MaxBodyBytes), far above the public one.
	InternalMaxBodyBytes int
	// Backups takes copies of this node's ledger for GET /v1/backup; nil
	// answers 503.
	Backups Backups
	// BackupStats, when set, reports the scheduled backups (-backup-dir)
	// in /metrics.
	BackupStats func() BackupStats
	// ClusterID, when set, is this node's cluster identity (a restored
	// cluster's; "" for none): joins that name another are refused.
	ClusterID func() string
}

// DefaultConfig listens on 127.0.0.1:8080.
func DefaultConfig() Config {
	return Config{
		Addr:         "127.0.0.1:8080",
		ReadTimeout:  10 * time.Second,
		WriteTimeout: 10 * time.Second,
		IdleTimeout:  60 * time.Second,
		MaxConns:     65536,
	}
}

// Validate names the first setting that cannot work.
func (c *Config) Validate() error {
	if c.Addr == "" {
		return errors.New("http: listen address is empty")
	}
	if c.ReadTimeout <= 0 || c.WriteTimeout <= 0 || c.IdleTimeout <= 0 {
		return fmt.Errorf("http: timeouts must be > 0 (read %s, write %s, idle %s)", c.ReadTimeout, c.WriteTimeout, c.IdleTimeout)
	}
	if c.MaxConns < 1 {
		return fmt.Errorf("http: max conns %d < 1", c.MaxConns)
	}
	return nil
}

// Server is the HTTP front of one node.
type Server struct {
	cfg     Config
	engine  Engine
	cluster Cluster
	logger  *slog.Logger
	fast    *fasthttp.Server
	peerSrv *fasthttp.Server // the node port's HTTP, on a cluster of node certificates
	ln      net.Listener
	latency *latencyHistogram
	version string
	peers   Peers
	creds   deductwire.Credentials
	loop    FrontDoor // nil unless SetFrontDoor
}

// FrontDoor is a server that takes some of the HTTP port's requests
// before this one sees them and hands it the rest (the deduct event loop,
// httpapi/eventloop): this server reports its metrics and stops it last.
type FrontDoor interface {
	// WriteMetrics appends its metrics in the Prometheus text format.
	WriteMetrics(w *bytes.Buffer)
	// Shutdown waits until none of its requests awaits an answer (or ctx
	// ends), then closes its connections.
	Shutdown(ctx context.Context) error
}

// SetFrontDoor tells the server that d serves in front of it. Call it
// before Serve.
func (s *Server) SetFrontDoor(d FrontDoor) { s.loop = d }

// Credentials are the service routes' credentials as this server checks
// them, for a front door that checks them too.
func (s *Server) Credentials() deductwire.Credentials { return s.creds }

// ObserveDeduct records a deduct's latency from start, for a front door
// that answers deducts (the same histogram as the handlers').
func (s *Server) ObserveDeduct(start time.Time) { s.latency.observe(start) }

// New builds a server; Serve or Start runs it.
func New(cfg Config, eng Engine, cluster Cluster, version string) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	s := &Server{
		cfg: cfg, engine: eng, cluster: cluster, version: version,
		logger:  logger.With("component", "http"),
		latency: newLatencyHistogram(),
	}
	s.creds = deductwire.Credentials{ServiceToken: cfg.ServiceToken, AdminToken: cfg.AdminToken, ClientCerts: cfg.ClientCerts}
	s.peers = cfg.Peers
	if s.peers == nil {
		s.peers = alone{}
	}
	s.fast = s.newFastServer(logger)
	if cfg.ListenerTimeouts {
		s.fast.ReadTimeout, s.fast.WriteTimeout, s.fast.IdleTimeout = 0, 0, 0
		// The deduct's latency is the one reading of the request's time
		// left (requestStart), made by the handler when it starts.
		s.fast.LazyRequestTime = true
	}
	return s, nil
}

// CertExpiry is when one certificate in use expires.
type CertExpiry struct {
	Name     string // what it is for: node, node-ca, http, http-client-ca
	NotAfter time.Time
}

func (s *Server) newFastServer(logger *slog.Logger) *fasthttp.Server {
	cfg := s.cfg
	return &fasthttp.Server{
		Handler:              s.handle,
		ErrorHandler:         s.handleTransportError,
		Name:                 "stockd",
		MaxRequestBodySize:   MaxBodyBytes,
		HeaderReceived:       s.bodyLimitFor,
		ReadTimeout:          cfg.ReadTimeout,
		WriteTimeout:         cfg.WriteTimeout,
		IdleTimeout:          cfg.IdleTimeout,
		Concurrency:          cfg.MaxConns,
		NoDefaultDate:        true,
		NoDefaultContentType: true,
		CloseOnShutdown:      true,
		Logger:               fasthttpLogger{logger.With("component", "http")},
	}
}

// Shutdown stops accepting connections, closes idle ones and waits for
// in-flight requests, until ctx ends.
func (s *Server) Shutdown(ctx context.Context) error {
	var errs []error
	if s.peerSrv != nil {
		if err := s.peerSrv.ShutdownWithContext(ctx); err != nil {
			errs = append(errs, fmt.Errorf("shut down the node port's http server: %w", err))
		}
	}
	if err := s.fast.ShutdownWithContext(ctx); err != nil {
		errs = append(errs, fmt.Errorf("shut down http server: %w", err))
	}
	if s.loop != nil {
		if err := s.loop.Shutdown(ctx); err != nil {
			errs = append(errs, fmt.Errorf("shut down the deduct loop: %w", err))
		}
	}
	return errors.Join(errs...)
}

var (
	pathV1SKUs         = []byte("/v1/skus/")
	pathV1Orders       = []byte("/v1/orders/")
	pathV1ClusterNodes = []byte("/v1/cluster/nodes/")
	pathV1Consumers    = []byte("/v1/consumers/")
	pathDebugPprof     = []byte("/debug/pprof/")
	suffixRestock      = []byte("/restock")
	suffixAudit        = []byte("/audit")
	suffixOrders       = []byte("/orders")
	suffixClose        = []byte("/close")
	suffixArchive      = []byte("/archive")
	suffixConfirm      = []byte("/confirm")
	suffixEnter        = []byte("/enter")
	suffixEntries      = []byte("/entries")
	suffixDraw         = []byte("/draw")
	infixEntries       = []byte("/entries/")
	suffixCancel       = []byte("/cancel")
)

func (s *Server) handle(ctx *fasthttp.RequestCtx) {
	defer func() {
		if r := recover(); r != nil {
			s.logger.Error("handler panic", "path", string(ctx.Path()), "panic", fmt.Sprint(r))
			ctx.Response.Reset()
			writeError(ctx, fasthttp.StatusInternalServerError, "internal", "internal error")
		}
	}()
	path := ctx.Path()
	method := ctx.Method()
	if s.clientCertMissing(ctx, path) {
		return
	}
	if bad := deductwire.RepeatedArg(ctx.QueryArgs()); bad != nil {
		writeRaw(ctx, fasthttp.StatusBadRequest, bad) // every route: no argument takes two values
		return
	}
	if sku, ok := deductwire.DeductSKU(path); ok {
		// The route the event loop serves too, found by the same test.
		if s.allow(ctx, method, fasthttp.MethodPost) && s.service(ctx) {
			s.handleDeduct(ctx, sku)
		}
		return
	}
	switch {
	case bytes.HasPrefix(path, pathV1SKUs):
		s.routeSKU(ctx, method, path[len(pathV1SKUs):])
	case bytes.HasPrefix(path, pathV1Orders):
		s.routeOrder(ctx, method, path[len(pathV1Orders):])
	case bytes.HasPrefix(path, pathV1Queue):
		s.routeQueue(ctx, method, path[len(pathV1Queue):])
	case bytes.Equal(path, pathV1Deducts):
		if s.allow(ctx, method, fasthttp.MethodPost) && s.service(ctx) {
			s.handleBatchDeduct(ctx)
		}
	case string(path) == "/v1/events":
		if s.allow(ctx, method, fasthttp.MethodGet) && s.service(ctx) {
			s.handleEvents(ctx)
		}
	case string(path) == "/v1/consumers":
		if s.allow(ctx, method, fasthttp.MethodGet) && s.service(ctx) {
			s.handleConsumers(ctx)
		}
	case bytes.HasPrefix(path, pathV1Consumers):
		s.routeConsumer(ctx, method, path[len(pathV1Consumers):])
	case string(path) == "/v1/openapi.json":
		if s.allow(ctx, method, fasthttp.MethodGet) {
			s.handleOpenAPI(ctx)
		}
	case string(path) == "/v1/stats":
		if s.allow(ctx, method, fasthttp.MethodGet) {
			s.handleStats(ctx)
		}
	case string(path) == "/ui" || string(path) == "/ui/" || bytes.HasPrefix(path, pathBuyerPage):
		if s.allow(ctx, method, fasthttp.MethodGet) {
			s.handlePage(ctx, path)
		}
	case string(path) == "/v1/cluster":
		if s.allow(ctx, method, fasthttp.MethodGet) {
			s.handleCluster(ctx)
		}
	case string(path) == "/v1/backup":
		if s.allow(ctx, method, fasthttp.MethodGet) && s.admin(ctx) {
			s.handleBackup(ctx)
		}
	case string(path) == "/v1/cluster/join":
		if s.allow(ctx, method, fasthttp.MethodPost) && s.adminOrPeer(ctx) {
			s.handleJoin(ctx)
		}
	case bytes.HasPrefix(path, pathV1ClusterNodes):
		if s.allow(ctx, method, fasthttp.MethodDelete) && s.admin(ctx) {
			s.handleRemoveNode(ctx, path[len(pathV1ClusterNodes):])
		}
	case bytes.HasPrefix(path, RouteInternal):
		if s.cfg.Internal == nil {
			writeError(ctx, fasthttp.StatusNotFound, "not_found", "internal routes are off on this node")
			return
		}
		s.cfg.Internal(ctx)
	case string(path) == "/healthz":
		writeJSON(ctx, fasthttp.StatusOK, map[string]any{"ok": true, "version": s.version})
	case string(path) == "/readyz":
		s.handleReady(ctx)
	case string(path) == "/metrics":
		s.handleMetrics(ctx)
	case bytes.HasPrefix(path, pathDebugPprof):
		// Profiles show internals and cost CPU: admin only.
		if s.admin(ctx) {
			pprofhandler.PprofHandler(ctx)
		}
	default:
		writeError(ctx, fasthttp.StatusNotFound, "not_found", "no such route")
	}
}

// routeSKU serves /v1/skus/{sku}[/restock|/audit|...] (the deduct is
// routed before, by deductwire.DeductSKU).
func (s *Server) routeSKU(ctx *fasthttp.RequestCtx, method, rest []byte) {
	if len(rest) > 0 && rest[len(rest)-1] == '/' {
		// No route ends in a slash: /v1/skus/p/restock/ is none of them,
		// not a read of a sale named "p/restock/" (405 "use GET").
		writeError(ctx, fasthttp.StatusNotFound, "not_found", "no such route (no route ends in /)")
		return
	}
	if i := bytes.Index(rest, infixEntries); i >= 0 {
		// A winner's standing names their order: guarded like orders.
		if s.allow(ctx, method, fasthttp.MethodGet) && s.service(ctx) {
			s.handleEntryStatus(ctx, rest[:i], rest[i+len(infixEntries):])
		}
		return
	}
	if s.routeQueueSKU(ctx, method, rest) {
		return
	}
	switch {
	case bytes.HasSuffix(rest, suffixEnter):
		if s.allow(ctx, method, fasthttp.MethodPost) && s.service(ctx) {
			s.handleEnter(ctx, rest[:len(rest)-len(suffixEnter)])
		}
	case bytes.HasSuffix(rest, suffixEntries):
		if s.allow(ctx, method, fasthttp.MethodGet) && s.service(ctx) {
			s.handleSaleEntries(ctx, rest[:len(rest)-len(suffixEntries)])
		}
	case bytes.HasSuffix(rest, suffixDraw):
		if s.allow(ctx, method, fasthttp.MethodGet) {
			s.handleDraw(ctx, rest[:len(rest)-len(suffixDraw)])
		}
	case bytes.HasSuffix(rest, suffixRestock):
		if s.allow(ctx, method, fasthttp.MethodPost) && s.admin(ctx) && !s.relayed(ctx) {
			s.handleRestock(ctx, rest[:len(rest)-len(suffixRestock)])
			s.markApplied(ctx)
		}
	case bytes.HasSuffix(rest, suffixAudit):
		if s.allow(ctx, method, fasthttp.MethodGet) {
			s.handleAudit(ctx, rest[:len(rest)-len(suffixAudit)])
		}
	case bytes.HasSuffix(rest, suffixClose), bytes.HasSuffix(rest, suffixArchive):
		run, suffix := s.engine.CloseSale, suffixClose
		if bytes.HasSuffix(rest, suffixArchive) {
			run, suffix = s.engine.ArchiveSale, suffixArchive
		}
		if s.allow(ctx, method, fasthttp.MethodPost) && s.admin(ctx) && !s.relayed(ctx) {
			s.handleSaleCommand(ctx, rest[:len(rest)-len(suffix)], run)
			s.markApplied(ctx)
		}
	case bytes.HasSuffix(rest, suffixOrders):
		if s.allow(ctx, method, fasthttp.MethodGet) && s.service(ctx) {
			s.handleSaleOrders(ctx, rest[:len(rest)-len(suffixOrders)])
		}
	case string(method) == fasthttp.MethodPut:
		if s.admin(ctx) && !s.relayed(ctx) {
			s.handleCreateSale(ctx, rest)
			s.markApplied(ctx)
		}
	default:
		if s.allow(ctx, method, fasthttp.MethodGet) {
			s.handleGetSKU(ctx, rest)
		}
	}
}

// routeOrder serves /v1/orders/{id}[/confirm|/cancel].
func (s *Server) routeOrder(ctx *fasthttp.RequestCtx, method, rest []byte) {
	switch {
	case bytes.HasSuffix(rest, suffixConfirm):
		if s.allow(ctx, method, fasthttp.MethodPost) && s.service(ctx) && !s.relayed(ctx) {
			s.handleOrderCommand(ctx, rest[:len(rest)-len(suffixConfirm)], s.engine.Confirm)
			s.markApplied(ctx)
		}
	case bytes.HasSuffix(rest, suffixCancel):
		if s.allow(ctx, method, fasthttp.MethodPost) && s.service(ctx) && !s.relayed(ctx) {
			s.handleOrderCommand(ctx, rest[:len(rest)-len(suffixCancel)], s.engine.Cancel)
			s.markApplied(ctx)
		}
	default:
		if s.allow(ctx, method, fasthttp.MethodGet) && s.service(ctx) {
			s.handleGetOrder(ctx, rest)
		}
	}
}

// allow answers 405 unless the method is want.
func (s *Server) allow(ctx *fasthttp.RequestCtx, method []byte, want string) bool {
	if string(method) == want {
		return true
	}
	ctx.Response.Header.Set("Allow", want)
	writeError(ctx, fasthttp.StatusMethodNotAllowed, "method_not_allowed", "use "+want)
	return false
}

// bodyLimitFor gives the internal routes their own body cap: a forwarded
// Take batch is far larger than any public request.
func (s *Server) bodyLimitFor(h *fasthttp.RequestHeader) fasthttp.RequestConfig {
	if limit := s.bodyLimit(h.RequestURI()); limit != MaxBodyBytes {
		return fasthttp.RequestConfig{MaxRequestBodySize: limit}
	}
	return fasthttp.RequestConfig{}
}

// bodyLimit is the body cap of a request URI: the internal routes' and the
// batch route's own, else MaxBodyBytes.
func (s *Server) bodyLimit(uri []byte) int {
	switch {
	case bytes.HasPrefix(uri, RouteInternal):
		return max(s.cfg.InternalMaxBodyBytes, MaxBodyBytes)
	case bytes.HasPrefix(uri, pathV1Deducts) && (len(uri) == len(pathV1Deducts) || uri[len(pathV1Deducts)] == '?'):
		return BatchMaxBodyBytes
	}
	return MaxBodyBytes
}

func (s *Server) handleTransportError(ctx *fasthttp.RequestCtx, err error) {
	var netErr net.Error
	if errors.As(err, &netErr) && netErr.Timeout() {
		// A connection that sent nothing (or stalled) within the read
		// timeout is closed without an answer: a response nobody asked
		// for would be read by the client as the answer to its next
		// request.
		ctx.Conn().Close()
		return
	}
	if errors.Is(err, fasthttp.ErrBodyTooLarge) {
		limit := s.bodyLimit(ctx.Request.Header.RequestURI())
		writeError(ctx, fasthttp.StatusRequestEntityTooLarge, "too_large", fmt.Sprintf("request body over %d bytes", limit))
		return
	}
	writeError(ctx, fasthttp.StatusBadRequest, "bad_request", "malformed http request")
}

// fasthttpLogger sends fasthttp's connection errors (client resets, bodies
// over the limit) to the debug level: they are about clients, not us.
type fasthttpLogger struct{ logger *slog.Logger }

func (l fasthttpLogger) Printf(format string, args ...any) {
	l.logger.Debug(fmt.Sprintf(format, args...))
}

// Serve serves on a listener the caller opened.
func (s *Server) Serve(ln net.Listener) {
	s.ln = ln
	go func() {
		if err := s.fast.Serve(ln); err != nil {
			s.logger.Error("http server stopped", "err", err)
		}
	}()
	s.logger.Info("serving http", "addr", ln.Addr().String())
}

// ServePeers serves the node-to-node calls of a cluster of node
// certificates on ln (the node port's HTTP listener, whose connections
// are PeerConns). Call it before Serve.
func (s *Server) ServePeers(ln net.Listener) {
	s.peerSrv = s.newFastServer(s.logger)
	s.peerSrv.Name = "stockd-peer"
	s.peerSrv.MaxRequestBodySize = max(s.cfg.InternalMaxBodyBytes, MaxBodyBytes)
	go func() {
		if err := s.peerSrv.Serve(ln); err != nil {
			s.logger.Error("node port http server stopped", "err", err)
		}
	}()
}
