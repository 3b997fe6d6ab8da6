package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"stockd/raftfsm"
	"stockd/shard"
)

// Errors of the engine's control-plane calls. Deduct reports its outcomes as
// a Status instead.
var (
	ErrUnknownSKU   = errors.New("unknown sku")
	ErrConflict     = errors.New("sale exists with another config")
	ErrInvalid      = errors.New("invalid request")
	ErrClosed       = errors.New("engine closed")
	ErrNotFound     = errors.New("order not found")
	ErrExpired      = errors.New("hold expired")
	ErrInvalidState = errors.New("order state does not allow this")
	ErrTooManySKUs  = errors.New("too many skus")
	// ErrUnavailable: the ledger could not take the command (no leader, no
	// quorum, shutting down); nothing was applied.
	ErrUnavailable = errors.New("ledger unavailable")
	// ErrOutcomeUnknown: the command may or may not have been applied.
	ErrOutcomeUnknown = errors.New("outcome unknown")
	// ErrTooLarge: the leader refused the command for its size; nothing
	// was applied, and the same bytes would be refused again (split them).
	ErrTooLarge = errors.New("command too large")
	// ErrRejected: the leader refused the command as malformed or not
	// allowed; nothing was applied, and sending it again cannot help.
	ErrRejected = errors.New("command rejected")
	// ErrDrainIncomplete: Close gave up on takes that could not commit in
	// time (no quorum, or the drain deadline). Their units stay leased to
	// this node, which loads them again at its next start.
	ErrDrainIncomplete = errors.New("drain incomplete")
)

// Limits, each with its reason.
const (
	// MaxQtyPerDeduct bounds one deduct: a flash sale sells a few units per
	// buyer, and a huge qty is a client bug, not a purchase.
	MaxQtyPerDeduct = 1000
	// MaxSKUs bounds the sales one node tracks (each holds buckets and a
	// goroutine-free lease state; the ledger row is small).
	MaxSKUs = 100_000
	// maxTakeBatchEntries bounds the takes of one batch (and so the
	// buyers one commit answers).
	maxTakeBatchEntries = 4096
	// stockPollInterval paces a waiting deduct's re-reads of the ledger.
	stockPollInterval = 5 * time.Millisecond
	// tryAgainAfter is the Retry-After of a try_again answer.
	tryAgainAfter = time.Second
	// applyWaitMax bounds how long a settled batch waits for this node to
	// apply it before its bookkeeping ends anyway.
	applyWaitMax = 5 * time.Second
	// drainLeaderlessMax is how long Close waits for queued takes while no
	// leader is reachable.
	drainLeaderlessMax = time.Second
	// demandPace spaces a node's demand leases for one sale while the
	// ledger has nothing available: holders need a round trip to answer.
	demandPace = 10 * time.Millisecond
	// leaseRetryBackoff spaces lease proposals that failed (no leader yet).
	leaseRetryBackoff = 20 * time.Millisecond
	// takeRetryBackoff spaces re-proposals of takes whose outcome is unknown.
	takeRetryBackoff = 20 * time.Millisecond
)

// Proposer replicates a command and returns the ledger's result once it is
// applied. It may be called from several goroutines at once. A single node
// passes its raftfsm.Node; a follower passes something that forwards to the
// leader.
//
// Errors are the engine's sentinels: ErrUnavailable (nothing applied; may
// be retried), ErrOutcomeUnknown (retry with the same order ids),
// ErrTooLarge and ErrRejected (nothing applied; never send the same command
// again). A raftfsm.Node also qualifies: its sentinels are mapped here.
type Proposer interface {
	Propose(atUnixNano int64, c raftfsm.Command) (*raftfsm.Result, error)
}

// Config holds the engine's knobs. Logger and NodeID are required.
type Config struct {
	NodeID string
	Logger *slog.Logger

	// BucketsPerSKU is the number of per-core counters per sale.
	BucketsPerSKU int
	// LeaseChunkMax caps one lease; chunks shrink toward 1 as the ledger's
	// available shrinks (available / LeaseDivisor).
	LeaseChunkMax int64
	LeaseDivisor  int64
	// LeaseWait is how long a deduct that finds the buckets empty waits for
	// a lease refill before answering.
	LeaseWait time.Duration
	// CommitWait is how long a wait=commit deduct waits for its batch to be
	// applied before it answers outcome_unknown.
	CommitWait time.Duration
	// ProposalsInFlightMax bounds Take proposals in flight while this node
	// leads; takes queue while all are busy and leave in the next batch.
	// One is fastest on a 2-core machine (bigger batches, less per-batch
	// CPU). ForwardedInFlightMax bounds them while the leader is another
	// node: a forwarded batch waits a network round trip and the leader's
	// commit, so several overlap.
	ProposalsInFlightMax int
	ForwardedInFlightMax int
	// TakeBatchBytesMax bounds one Take batch's encoded size, well under
	// raft's suggested 512 KiB per entry and the internal wire's cap.
	TakeBatchBytesMax int
	// TakeQueueMax bounds won takes waiting for a proposal slot.
	TakeQueueMax int
	// LeaseIdleReturn: a sale's unused lease goes back to the ledger when
	// no unit was taken from this node's buckets for this long, so stock
	// never sits stranded here while another node turns buyers away.
	LeaseIdleReturn time.Duration
	// ReclaimAfter: the leader reclaims the leases of a peer it has not
	// reached for this long (and at once of a node no longer a member).
	ReclaimAfter time.Duration
	// RequestRetention and RequestMaxKeep bound the request ids the ledger
	// remembers for idempotency: the leader prunes ids older than the
	// retention, and the oldest beyond the count.
	RequestRetention time.Duration
	RequestMaxKeep   int64
	// AuditInterval paces the periodic self-audit of every sale.
	AuditInterval time.Duration
	// RateLimit caps deducts per second on this node (0: no cap), with
	// RateBurst of headroom; MaxInFlight caps deducts being served at once
	// (0: no cap). Both answer 429 with a retry time; sold-out and
	// not-started answers come before them and are never limited.
	RateLimit   float64
	RateBurst   int
	MaxInFlight int
	// AdvertiseHTTP is this node's HTTP address as peers reach it; the
	// engine registers it in the ledger so followers can forward to it.
	AdvertiseHTTP string
	// Cluster tells the engine about raft; nil for a node without peers
	// in tests (always healthy, never leader duties).
	Cluster Cluster
	// Now is the clock; tests replace it.
	Now func() time.Time
}

// Cluster is the engine's view of raft. Its methods may be called from any
// goroutine and must return quickly.
type Cluster interface {
	// IsLeader reports whether this node leads now.
	IsLeader() bool
	// CommitHealthy reports whether a proposal could commit now: a leader
	// is known and this node is in contact with it.
	CommitHealthy() bool
	// Unreachable returns, on the leader, peers it cannot heartbeat, with
	// their last contact.
	Unreachable() map[string]time.Time
	// MemberIDs returns the voters' ids.
	MemberIDs() ([]string, error)
}

// DefaultConfig returns the knobs for node id n1.
func DefaultConfig() Config {
	return Config{
		NodeID:               "n1",
		BucketsPerSKU:        runtime.GOMAXPROCS(0),
		LeaseChunkMax:        1024,
		LeaseDivisor:         4,
		LeaseWait:            2 * time.Second,
		CommitWait:           5 * time.Second,
		ProposalsInFlightMax: 1,
		ForwardedInFlightMax: 4,
		TakeBatchBytesMax:    256 << 10,
		TakeQueueMax:         1 << 16,
		LeaseIdleReturn:      time.Second,
		ReclaimAfter:         10 * time.Second,
		RequestRetention:     24 * time.Hour,
		RequestMaxKeep:       1_000_000,
		AuditInterval:        30 * time.Second,
		RateBurst:            1000,
		MaxInFlight:          10_000,
		Now:                  time.Now,
	}
}

// Validate names the first knob that cannot work.
func (c *Config) Validate() error {
	switch {
	case c.NodeID == "":
		return errors.New("engine: node id is empty")
	case c.BucketsPerSKU < 1 || c.BucketsPerSKU > shard.MaxBuckets:
		return fmt.Errorf("engine: buckets per sku %d outside 1..%d", c.BucketsPerSKU, shard.MaxBuckets)
	case c.LeaseChunkMax < 1:
		return fmt.Errorf("engine: lease chunk max %d < 1", c.LeaseChunkMax)
	case c.LeaseDivisor < 1:
		return fmt.Errorf("engine: lease divisor %d < 1", c.LeaseDivisor)
	case c.LeaseWait <= 0 || c.CommitWait <= 0:
		return fmt.Errorf("engine: lease wait %s and commit wait %s must be > 0", c.LeaseWait, c.CommitWait)
	case c.ProposalsInFlightMax < 1 || c.ForwardedInFlightMax < 1:
		return fmt.Errorf("engine: proposals in flight %d and forwarded in flight %d must be >= 1", c.ProposalsInFlightMax, c.ForwardedInFlightMax)
	case c.TakeBatchBytesMax < 1<<10:
		return fmt.Errorf("engine: take batch bytes max %d < 1 KiB", c.TakeBatchBytesMax)
	case c.TakeQueueMax < 1:
		return fmt.Errorf("engine: take queue max %d < 1", c.TakeQueueMax)
	case c.Now == nil:
		return errors.New("engine: clock is nil")
	case c.LeaseIdleReturn <= 0 || c.ReclaimAfter <= 0:
		return fmt.Errorf("engine: lease idle return %s and reclaim after %s must be > 0", c.LeaseIdleReturn, c.ReclaimAfter)
	case c.RequestRetention <= 0 || c.RequestMaxKeep < 1:
		return fmt.Errorf("engine: request retention %s must be > 0 and request max keep %d >= 1", c.RequestRetention, c.RequestMaxKeep)
	case c.AuditInterval <= 0:
		return fmt.Errorf("engine: audit interval %s must be > 0", c.AuditInterval)
	case c.RateLimit < 0 || c.MaxInFlight < 0 || (c.RateLimit > 0 && c.RateBurst < 1):
		return fmt.Errorf("engine: rate limit %g and max in flight %d must be >= 0, rate burst %d >= 1 with a rate", c.RateLimit, c.MaxInFlight, c.RateBurst)
	}
	return nil
}

// sale is one SKU's node-local selling state. Fields read on the fast path
// are atomics; the rest change only on the FSM goroutine or the leaser.
type sale struct {
	sku             string
	buckets         *shard.Buckets
	startAtUnixNano int64 // immutable after creation
	perUser         int64
	holdTTL         time.Duration

	soldOut       atomic.Bool  // no unit here and none available in the ledger
	refillQueued  atomic.Bool  // a lease request is queued or in flight
	giveQueued    atomic.Bool  // a give-back (another node wants units) is queued or in flight
	lowWatermark  atomic.Int64 // refill when the buckets hold fewer units
	takesInFlight atomic.Int64 // units taken from buckets, not yet resolved by the ledger
	leaseAtLeast  atomic.Int64 // the largest qty a waiting deduct needs; the next lease covers it
	lastUseNanos  atomic.Int64 // last take or lease grant here; idle leases go back after LeaseIdleReturn
	// The sale's tail on this node: the first sold_out answer (0: none
	// since stock last came back) and the last committed win.
	firstSoldOutNanos atomic.Int64
	lastWinNanos      atomic.Int64
	stockChanged      signal
}

// Engine sells from one node. Its methods may be called from any goroutine.
type Engine struct {
	cfg      Config
	logger   *slog.Logger
	ledger   Ledger
	proposer Proposer

	salesMu sync.Mutex                       // serialises writers of sales
	sales   atomic.Pointer[map[string]*sale] // copy on write: lock-free reads

	orderIDs   *orderIDs
	pendingReq *stripedMap[*pendingTake] // request id -> take awaiting commit
	pendingIDs *pendingFilter            // request ids that may be in pendingReq, lock-free
	pendingOrd *stripedMap[*pendingTake] // order id -> take awaiting commit
	turnedDown *turnedDown               // pending orders the ledger did not take

	takeQueue    chan *pendingTake
	localSlots   chan struct{} // semaphore of Take proposals while leading
	forwardSlots chan struct{} // semaphore of Take proposals forwarded to a leader
	refills      chan *sale
	giveBacks    chan *sale

	ignoreEventsUpTo atomic.Uint64 // events at or below this index are already in the buckets

	// commitBlocked opens the breaker: wait=commit deducts answer 503 at
	// once instead of queueing while no proposal can commit.
	commitBlocked       atomic.Bool
	consecutiveFailures atomic.Int64
	failOpenUntilNanos  atomic.Int64

	auditing atomic.Bool // a periodic audit is running

	closing atomic.Bool // deducts answer unavailable: the node is stopping
	closed  atomic.Bool
	stop    chan struct{}
	wg      sync.WaitGroup

	metrics   *Metrics
	admission *admission
}

// New builds an engine over an open ledger (a *raftfsm.Ledger, or a fake
// in tests), loads every sale's buckets with
// the units leased to this node, and registers itself as the ledger's
// observer. Call it before raft starts applying entries, then Start it with
// the proposer once raft runs.
func New(cfg Config, ledger Ledger) (*Engine, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	e := &Engine{
		cfg:          cfg,
		logger:       logger.With("component", "engine", "node", cfg.NodeID),
		ledger:       ledger,
		pendingReq:   newStripedMap[*pendingTake](),
		pendingIDs:   newPendingFilter(cfg.Now()),
		pendingOrd:   newStripedMap[*pendingTake](),
		turnedDown:   newTurnedDown(),
		takeQueue:    make(chan *pendingTake, cfg.TakeQueueMax),
		localSlots:   make(chan struct{}, cfg.ProposalsInFlightMax),
		forwardSlots: make(chan struct{}, cfg.ForwardedInFlightMax),
		refills:      make(chan *sale, MaxSKUs),
		giveBacks:    make(chan *sale, MaxSKUs),
		stop:         make(chan struct{}),
		metrics:      newMetrics(),
		admission:    newAdmission(cfg.RateLimit, cfg.RateBurst, cfg.MaxInFlight),
	}
	// Order ids must never repeat, even across restarts and for pending
	// orders a crash lost: the sequence starts at the boot time in
	// microseconds, far above any earlier run's sequence.
	e.orderIDs = newOrderIDs(cfg.NodeID, uint64(cfg.Now().UnixMicro()))
	empty := map[string]*sale{}
	e.sales.Store(&empty)
	e.rebuild()
	ledger.SetObserver(e)
	return e, nil
}

// Start begins proposing: the committer and the leaser run from here on.
// Call it once, before Close.
func (e *Engine) Start(proposer Proposer) {
	e.proposer = proposer
	e.wg.Add(3)
	go e.runCommitter()
	go e.runLeaser()
	go e.runJanitor()
}

// rebuild makes the buckets agree with the ledger: every sale's buckets hold
// leased[me] less the takes in flight. Called at start and after a restore.
func (e *Engine) rebuild() {
	rows, applied := e.ledger.SKUs()
	e.ignoreEventsUpTo.Store(applied)
	for i := range rows {
		s, _ := e.saleFor(&rows[i])
		s.buckets.Drain()
		if units := rows[i].Leased[e.cfg.NodeID] - s.takesInFlight.Load(); units > 0 {
			s.buckets.Load(units)
		}
		e.updateSoldOut(s)
		s.stockChanged.broadcast()
	}
}

// saleFor returns the engine's sale for a ledger row, creating it if new.
func (e *Engine) saleFor(row *raftfsm.SKU) (*sale, bool) {
	if s, ok := (*e.sales.Load())[row.SKU]; ok {
		return s, false
	}
	e.salesMu.Lock()
	defer e.salesMu.Unlock()
	old := *e.sales.Load()
	if s, ok := old[row.SKU]; ok {
		return s, false
	}
	s := &sale{
		sku:             row.SKU,
		buckets:         shard.New(e.cfg.BucketsPerSKU),
		startAtUnixNano: row.Config.StartAtUnixNano,
		perUser:         row.Config.PerUser,
		holdTTL:         time.Duration(row.Config.HoldTTLNanos),
	}
	s.lowWatermark.Store(1)
	next := make(map[string]*sale, len(old)+1)
	for k, v := range old {
		next[k] = v
	}
	next[row.SKU] = s
	e.sales.Store(&next)
	return s, true
}

func (e *Engine) lookupSale(sku []byte) *sale {
	return (*e.sales.Load())[string(sku)]
}

// updateSoldOut sets or clears the sold-out flag. The flag is the
// cluster's truth (DESIGN.md): set only when this node's buckets are empty
// and its applied ledger has no unit available or leased to any node.
// Setting is checked again after the store, so a unit that comes back
// concurrently clears the flag rather than hiding behind it.
func (e *Engine) updateSoldOut(s *sale) {
	soldOut := func() bool {
		row, _, ok := e.ledger.SKU(s.sku)
		return ok && s.buckets.Units() == 0 && row.Available == 0 && row.LeasedTotal() == 0
	}
	if !soldOut() {
		s.soldOut.Store(false)
		return
	}
	if s.soldOut.Swap(true) {
		return
	}
	if !soldOut() {
		s.soldOut.Store(false)
		return
	}
	e.logger.Info("sale sold out", "sku", s.sku)
}

// Applied receives ledger events on raft's FSM goroutine (raftfsm.Observer).
func (e *Engine) Applied(events []raftfsm.Event) {
	for _, ev := range events {
		if ev.Kind == raftfsm.EventReplaced {
			e.logger.Warn("ledger replaced by a snapshot; rebuilding buckets", "applied_index", ev.Index)
			e.rebuild()
			continue
		}
		if ev.Index <= e.ignoreEventsUpTo.Load() {
			continue
		}
		switch ev.Kind {
		case raftfsm.EventSaleCreated, raftfsm.EventStockChanged, raftfsm.EventLeaseReturned:
			row, _, ok := e.ledger.SKU(ev.SKU)
			if !ok {
				continue
			}
			s, created := e.saleFor(&row)
			if created {
				e.logger.Info("sale created", "sku", ev.SKU, "total", row.Total)
			}
			if row.Available > 0 {
				s.soldOut.Store(false)
				s.firstSoldOutNanos.Store(0) // stock came back: a new tail, if it sells out again
				s.stockChanged.broadcast()
			}
		case raftfsm.EventLeaseGranted:
			if ev.Node != e.cfg.NodeID {
				continue
			}
			row, _, ok := e.ledger.SKU(ev.SKU)
			if !ok {
				continue
			}
			s, _ := e.saleFor(&row)
			s.buckets.Load(ev.Qty)
			s.lowWatermark.Store(max(1, ev.Qty/2))
			s.lastUseNanos.Store(e.cfg.Now().UnixNano())
			s.soldOut.Store(false)
			s.stockChanged.broadcast()
			e.metrics.leaseGranted.Add(uint64(ev.Qty))
		case raftfsm.EventLeaseWanted:
			if ev.Node == e.cfg.NodeID {
				continue
			}
			if s := e.lookupSale([]byte(ev.SKU)); s != nil {
				e.requestGiveBack(s)
			}
		case raftfsm.EventReclaimed:
			e.metrics.leaseReclaimed.Add(uint64(ev.Qty))
			if ev.Node != e.cfg.NodeID {
				// Stock came back to available: deducts here may win again.
				for _, s := range *e.sales.Load() {
					s.soldOut.Store(false)
					s.stockChanged.broadcast()
				}
				continue
			}
			e.logger.Warn("the ledger reclaimed this node's leases; rebuilding buckets", "units", ev.Qty)
			e.rebuild()
		}
	}
}

func (e *Engine) nextOrderID() string { return e.orderIDs.next() }

// SaleSpec is what CreateSale needs; zero values mean "none".
type SaleSpec struct {
	Total   int64
	StartAt time.Time
	PerUser int64
	HoldTTL time.Duration
}

// CreateSale creates a sale. It reports created=false when a sale with the
// same config already exists, and ErrConflict when one with another exists.
func (e *Engine) CreateSale(sku string, spec SaleSpec) (created bool, err error) {
	if sku == "" || spec.Total < 0 || spec.PerUser < 0 || spec.HoldTTL < 0 {
		return false, fmt.Errorf("%w: sale %q needs total, per_user and hold_ttl >= 0", ErrInvalid, sku)
	}
	if _, _, ok := e.ledger.SKU(sku); !ok && len(*e.sales.Load()) >= MaxSKUs {
		return false, fmt.Errorf("%w: this node holds %d", ErrTooManySKUs, MaxSKUs)
	}
	cfg := raftfsm.SaleConfig{Total: spec.Total, PerUser: spec.PerUser, HoldTTLNanos: int64(spec.HoldTTL)}
	if !spec.StartAt.IsZero() {
		cfg.StartAtUnixNano = spec.StartAt.UnixNano()
	}
	res, err := e.propose(&raftfsm.CreateSale{SKU: sku, Sale: cfg})
	if err != nil {
		return false, err
	}
	switch res.Outcome {
	case raftfsm.OutcomeOK:
		return true, nil
	case raftfsm.OutcomeSame:
		return false, nil
	case raftfsm.OutcomeConflict:
		return false, fmt.Errorf("%w: sku %q", ErrConflict, sku)
	}
	return false, fmt.Errorf("%w: %s %s", ErrInvalid, res.Outcome, res.Detail)
}

// Restock adds qty units to a sale.
func (e *Engine) Restock(sku string, qty int64) error {
	if qty <= 0 {
		return fmt.Errorf("%w: restock qty %d <= 0", ErrInvalid, qty)
	}
	res, err := e.propose(&raftfsm.Restock{SKU: sku, Qty: qty})
	if err != nil {
		return err
	}
	switch res.Outcome {
	case raftfsm.OutcomeOK:
		return nil
	case raftfsm.OutcomeUnknownSKU:
		return fmt.Errorf("%w: %q", ErrUnknownSKU, sku)
	}
	return fmt.Errorf("%w: %s %s", ErrInvalid, res.Outcome, res.Detail)
}

// propose stamps c with the engine's clock and replicates it. Its errors
// are the engine's sentinels (see Proposer).
func (e *Engine) propose(c raftfsm.Command) (*raftfsm.Result, error) {
	res, err := e.proposer.Propose(e.cfg.Now().UnixNano(), c)
	switch {
	case err == nil:
		return res, nil
	case errors.Is(err, ErrOutcomeUnknown), errors.Is(err, ErrUnavailable), errors.Is(err, ErrTooLarge), errors.Is(err, ErrRejected):
		return nil, fmt.Errorf("%s: %w", c.Op(), err)
	case errors.Is(err, raftfsm.ErrOutcomeUnknown):
		return nil, fmt.Errorf("%w: %s: %w", ErrOutcomeUnknown, c.Op(), err)
	case errors.Is(err, raftfsm.ErrMalformed):
		return nil, fmt.Errorf("%w: %s: %w", ErrRejected, c.Op(), err)
	default:
		return nil, fmt.Errorf("%w: %s: %w", ErrUnavailable, c.Op(), err)
	}
}

// SKUView is a sale as GET /v1/skus/{sku} shows it.
type SKUView struct {
	Row   raftfsm.SKU
	State string // upcoming, open, sold_out
}

// Sale states.
const (
	StateUpcoming = "upcoming"
	StateOpen     = "open"
	StateSoldOut  = "sold_out"
)

// SKU reads a sale from the local ledger.
func (e *Engine) SKU(sku string) (SKUView, bool) {
	row, _, ok := e.ledger.SKU(sku)
	if !ok {
		return SKUView{}, false
	}
	v := SKUView{Row: row, State: StateOpen}
	switch {
	case row.Remaining() <= 0:
		v.State = StateSoldOut
	case row.Config.StartAtUnixNano > e.cfg.Now().UnixNano():
		v.State = StateUpcoming
	}
	return v, true
}

// Order reads an order: from the ledger once committed, else from this
// node's pending takes (state pending), else from the pending orders the
// ledger turned down (state released, reason turned_down_<why>).
func (e *Engine) Order(id string) (raftfsm.Order, bool, error) {
	o, ok, err := e.ledger.Order(id)
	if err != nil || ok {
		return o, ok, err
	}
	if p, ok := e.pendingOrd.get(id); ok {
		if r, done := p.outcome(); done && r.Status.Won() {
			return r.Order, true, nil
		}
		return p.pendingOrder(), true, nil
	}
	if o, ok := e.turnedDown.get(id); ok {
		if o.ID != id {
			// A repeat of a request id won elsewhere: the real order.
			return e.ledger.Order(o.ID)
		}
		return o, true, nil
	}
	return raftfsm.Order{}, false, nil
}

// Confirm turns a held order sold.
func (e *Engine) Confirm(id string) (raftfsm.Order, error) {
	return e.orderCommand(&raftfsm.Confirm{OrderID: id})
}

// Cancel releases a held order; its units return to available.
func (e *Engine) Cancel(id string) (raftfsm.Order, error) {
	return e.orderCommand(&raftfsm.Release{OrderID: id, Reason: raftfsm.ReleaseCancelled})
}

func (e *Engine) orderCommand(c raftfsm.Command) (raftfsm.Order, error) {
	res, err := e.propose(c)
	if err != nil {
		return raftfsm.Order{}, err
	}
	var o raftfsm.Order
	if res.Order != nil {
		o = *res.Order
	}
	switch res.Outcome {
	case raftfsm.OutcomeOK, raftfsm.OutcomeSame:
		return o, nil
	case raftfsm.OutcomeNotFound:
		return o, ErrNotFound
	case raftfsm.OutcomeExpired:
		return o, ErrExpired
	case raftfsm.OutcomeInvalidState:
		return o, ErrInvalidState
	}
	return o, fmt.Errorf("%w: %s %s", ErrInvalid, res.Outcome, res.Detail)
}

// Audit recounts a sale in the local ledger and checks this node's local
// law: units in its buckets plus its takes in flight equal leased[me].
func (e *Engine) Audit(sku string) (raftfsm.Audit, LocalAudit, bool, error) {
	a, ok, err := e.ledger.AuditSKU(sku)
	if err != nil || !ok {
		return a, LocalAudit{}, ok, err
	}
	var local LocalAudit
	if s := e.lookupSale([]byte(sku)); s != nil {
		local = LocalAudit{
			Buckets:       s.buckets.Units(),
			TakesInFlight: s.takesInFlight.Load(),
			Leased:        a.Row.Leased[e.cfg.NodeID],
		}
		local.OK = local.Buckets+local.TakesInFlight == local.Leased
	}
	return a, local, true, nil
}

// LocalAudit is the node-local law at the moment of the audit. Under load it
// can be off by the units of a lease or take being applied right then.
type LocalAudit struct {
	OK            bool  `json:"ok"`
	Buckets       int64 `json:"buckets"`
	TakesInFlight int64 `json:"takes_in_flight"`
	Leased        int64 `json:"leased"`
}

// BeginDrain makes new deducts answer unavailable at once, so a stopping
// node's in-flight requests finish while no new ones start. Close follows.
func (e *Engine) BeginDrain() { e.closing.Store(true) }

// Close stops taking deducts, waits (bounded by ctx) for queued takes to be
// proposed, returns unused leases where the ledger accepts it, and stops the
// engine's goroutines.
func (e *Engine) Close(ctx context.Context) error {
	e.closing.Store(true)
	if e.closed.Swap(true) {
		return nil
	}
	if e.proposer == nil { // never started: nothing queued, nothing to return
		close(e.stop)
		return nil
	}
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	var leaderlessSince time.Time
	for e.pendingOrd.len() > 0 {
		// Without a leader nothing can commit: when the whole cluster
		// stops at once, waiting out the drain timeout helps nobody. The
		// units stay leased here; the next start loads them again.
		if e.LeaderReachable() {
			leaderlessSince = time.Time{}
		} else if leaderlessSince.IsZero() {
			leaderlessSince = time.Now()
		}
		giveUp := !leaderlessSince.IsZero() && time.Since(leaderlessSince) >= drainLeaderlessMax
		select {
		case <-ctx.Done():
			giveUp = true
		case <-tick.C:
		}
		if giveUp {
			n := e.pendingOrd.len()
			e.logger.Warn("closing with takes not yet committed; their buyers were told outcome_unknown", "takes", n, "leader_reachable", e.LeaderReachable())
			close(e.stop)
			e.wg.Wait()
			return fmt.Errorf("%w: %d takes not committed", ErrDrainIncomplete, n)
		}
	}
	for _, s := range *e.sales.Load() {
		units := s.buckets.Drain()
		if units <= 0 {
			continue
		}
		res, err := e.propose(&raftfsm.Return{Node: e.cfg.NodeID, SKU: s.sku, Qty: units})
		if err != nil {
			// The units stay leased to this node; the next start loads them
			// back into the buckets from the ledger.
			e.logger.Warn("could not return lease at close", "sku", s.sku, "units", units, "err", err)
			continue
		}
		e.logger.Info("returned unused lease", "sku", s.sku, "units", res.Qty)
	}
	close(e.stop)
	e.wg.Wait()
	return nil
}

// Ledger types the engine's callers see, so that they need not import
// raftfsm.
type (
	Order  = raftfsm.Order
	Audit  = raftfsm.Audit
	SKURow = raftfsm.SKU
)

// NodeAddrs returns the HTTP addresses nodes registered in the ledger.
func (e *Engine) NodeAddrs() map[string]string { return e.ledger.NodeAddrs() }

// AppliedIndex is the last log index this node's ledger holds.
func (e *Engine) AppliedIndex() uint64 { return e.ledger.AppliedIndex() }

// WaitApplied blocks until this node's ledger holds log index or ctx ends.
func (e *Engine) WaitApplied(ctx context.Context, index uint64) error {
	return e.ledger.WaitApplied(ctx, index)
}

// CommitBlocked reports whether the breaker refuses wait=commit deducts.
func (e *Engine) CommitBlocked() bool { return e.commitBlocked.Load() }

// Reclaim returns all of node's leases to available (after it left the
// cluster) and reports the units.
func (e *Engine) Reclaim(node string) (int64, error) {
	res, err := e.propose(&raftfsm.Reclaim{Node: node})
	if err != nil {
		return 0, err
	}
	return res.Qty, nil
}

// LeaderReachable reports whether this node is in contact with a raft
// leader: its reads are then current, not stale. Without a cluster (tests)
// it is always true.
func (e *Engine) LeaderReachable() bool {
	return e.cfg.Cluster == nil || e.cfg.Cluster.CommitHealthy()
}
