package engine

import (
	"context"
	"fmt"
	"hash/maphash"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"stockd.dev/stockd/engine/admission"
	"stockd.dev/stockd/internal/batcher"
	"stockd.dev/stockd/internal/deadline"
	"stockd.dev/stockd/internal/pendingfilter"
	"stockd.dev/stockd/raftfsm/command"
	"stockd.dev/stockd/raftfsm/orderid"
)

// Engine sells from one node. Its methods may be called from any goroutine.
type Engine struct {
	cfg      Config
	logger   *slog.Logger
	ledger   Ledger
	proposer Proposer

	salesMu sync.Mutex                       // serialises writers of sales
	sales   atomic.Pointer[map[string]*sale] // copy on write: lock-free reads

	orderIDs   *orderid.Minter
	pendingReq *takeIndex            // request id -> take awaiting commit
	pendingIDs *pendingfilter.Filter // request ids that may be in pendingReq, lock-free
	batchSeed  maphash.Seed          // hashes a batch's request keys (reusedInBatch)
	prefetched atomic.Uint64         // the words prefetchRequests read, summed so that they are read
	deadlines  *deadline.Set         // shared timeouts of waiting deducts
	// commitWaits are the deadlines of deducts waiting for the ledger's
	// answer (awaitPending); they also end, all at once, when the engine
	// stops or its drain loses the leader, so that such a wait selects on
	// two channels, its take's and one of these.
	commitWaits *deadline.Set
	asyncWaits  asyncWaits  // DeductAsync callers waiting for the ledger
	pendingOrd  *takeIndex  // order id -> take awaiting commit
	turnedDown  *turnedDown // pending orders the ledger did not take

	takeQueue    chan *pendingTake
	takes        *batcher.Batcher[*pendingTake] // the group commit of takeQueue (Start)
	localSlots   chan struct{}                  // semaphore of Take proposals while leading
	forwardSlots chan struct{}                  // semaphore of Take proposals forwarded to a leader
	refills      chan *sale
	giveBacks    chan *sale
	poll         *poller // wakes deducts waiting for stock

	ignoreEventsUpTo atomic.Uint64 // events at or below this index are already in the buckets

	// commitBlocked opens the breaker: wait=commit deducts answer 503 at
	// once instead of queueing while no proposal can commit.
	commitBlocked atomic.Bool
	// breakerClosedOnce: the breaker has closed since the start (the
	// janitor's); before that, an open breaker is a node finding its
	// leader, not a warning.
	breakerClosedOnce   bool
	consecutiveFailures atomic.Int64
	failOpenUntilNanos  atomic.Int64

	closing atomic.Bool // deducts answer unavailable: the node is stopping
	// drainLost closes once the node is stopping and has reached no leader
	// for drainLeaderlessMax: deducts waiting for a commit then answer
	// outcome_unknown at once instead of at their commit wait (the last
	// node of a cluster stopping at once took 6 s to stop).
	drainLost  chan struct{}
	drainWatch sync.Once
	closed     atomic.Bool
	catchUps   catchUps
	// born is the engine's start on the monotonic clock, from which
	// vouchedUntil counts (vouch.go); answered is the highest log index
	// of a write this node has answered.
	born         time.Time
	vouchedUntil atomic.Int64
	answered     atomic.Uint64
	stop         chan struct{}
	// stopped is done once stop is closed, for waits that take a context.
	stopped    context.Context
	endStopped context.CancelFunc
	wg         sync.WaitGroup

	metrics   *Metrics
	admission *admission.Gate
	adaptive  *admission.Adaptive
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
		pendingReq:   newTakeIndex(byRequest),
		pendingIDs:   pendingfilter.New(cfg.Now()),
		batchSeed:    maphash.MakeSeed(),
		deadlines:    deadline.New(time.Now),
		commitWaits:  deadline.New(time.Now),
		pendingOrd:   newTakeIndex(byOrder),
		turnedDown:   newTurnedDown(),
		takeQueue:    make(chan *pendingTake, cfg.TakeQueueMax),
		localSlots:   make(chan struct{}, cfg.ProposalsInFlightMax),
		forwardSlots: make(chan struct{}, cfg.ForwardedInFlightMax),
		refills:      make(chan *sale, MaxSKUs),
		giveBacks:    make(chan *sale, MaxSKUs),
		drainLost:    make(chan struct{}),
		poll:         newPoller(),
		born:         time.Now(),
		stop:         make(chan struct{}),
		metrics:      newMetrics(),
		admission:    admission.NewGate(cfg.RateLimit, cfg.RateBurst, cfg.MaxInFlight),
		adaptive:     admission.NewAdaptive(cfg.AdmissionLatency, cfg.MaxInFlight),
	}
	// Order ids must never repeat, even across restarts and for pending
	// orders a crash lost: the sequence starts at the boot time in
	// microseconds, far above any earlier run's sequence.
	e.orderIDs = orderid.NewMinter(cfg.NodeID, uint64(cfg.Now().UnixMicro()))
	e.stopped, e.endStopped = context.WithCancel(context.Background())
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
	e.wg.Add(4)
	e.takes = e.committer()
	go e.takes.Run()
	go e.runLeaser()
	go e.runJanitor()
	go func() { defer e.wg.Done(); e.poll.run(e.stop, e.pollWaiting) }()
}

func (e *Engine) nextOrderID() string { return e.orderIDs.Next() }

// BeginDrain makes new deducts answer unavailable at once, so a stopping
// node's in-flight requests finish while no new ones start. Close follows.
func (e *Engine) BeginDrain() {
	e.closing.Store(true)
	e.drainWatch.Do(func() { go e.watchLeaderlessDrain() })
}

// watchLeaderlessDrain closes drainLost once no leader has been reachable
// for drainLeaderlessMax while the node stops; it ends with the engine.
func (e *Engine) watchLeaderlessDrain() {
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	var since time.Time
	for {
		select {
		case <-e.stop:
			return
		case <-t.C:
		}
		switch {
		case e.LeaderReachable():
			since = time.Time{}
		case since.IsZero():
			since = time.Now()
		case time.Since(since) >= drainLeaderlessMax:
			close(e.drainLost)
			e.commitWaits.End()
			return
		}
	}
}

// Close stops taking deducts, waits (bounded by ctx) for queued takes to be
// proposed, returns unused leases where the ledger accepts it, and stops the
// engine's goroutines.
func (e *Engine) Close(ctx context.Context) error {
	e.BeginDrain()
	if e.closed.Swap(true) {
		return nil
	}
	if e.proposer == nil { // never started: nothing queued, nothing to return
		e.halt()
		return nil
	}
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for e.pendingOrd.len() > 0 {
		// Without a leader nothing can commit: when the whole cluster
		// stops at once, waiting out the drain timeout helps nobody. The
		// units stay leased here; the next start loads them again.
		giveUp := false
		select {
		case <-ctx.Done():
			giveUp = true
		case <-e.drainLost:
			giveUp = true
		case <-tick.C:
		}
		if giveUp {
			n := e.pendingOrd.len()
			e.logger.Warn("closing with takes not yet committed; their buyers were told outcome_unknown", "takes", n, "leader_reachable", e.LeaderReachable())
			e.halt()
			e.wg.Wait()
			return fmt.Errorf("%w: %d takes not committed", ErrDrainIncomplete, n)
		}
	}
	select {
	case <-e.drainLost:
		// No leader to return leases to: they stay leased here, and the
		// next start loads them again.
		e.logger.Warn("closing without a leader: unused leases stay with this node")
		e.halt()
		e.wg.Wait()
		return nil
	default:
	}
	for _, s := range *e.sales.Load() {
		units := s.buckets.Drain()
		if units <= 0 {
			continue
		}
		res, err := e.propose(&command.Return{Node: e.cfg.NodeID, SKU: s.sku, Qty: units})
		if err != nil {
			// The units stay leased to this node; the next start loads them
			// back into the buckets from the ledger.
			e.logger.Warn("could not return lease at close", "sku", s.sku, "units", units, "err", err)
			continue
		}
		e.logger.Info("returned unused lease", "sku", s.sku, "units", res.Qty)
	}
	e.halt()
	e.wg.Wait()
	return nil
}

// halt tells the engine's goroutines to end.
func (e *Engine) halt() {
	close(e.stop)
	e.commitWaits.End()
	e.endStopped()
}
