// Package control is a node's control plane: what an operator or a
// service asks of sales and orders besides deducting (creating, restocking,
// closing and archiving sales; confirming and cancelling orders), the
// order feed's reads, consumers and retention, and lottery entries and
// draws. It runs over the engine, the data plane, which it reaches
// through the engine's exported methods and the ledger through small role
// interfaces; the engine knows nothing of it.
package control

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"stockd.dev/stockd/engine"
	"stockd.dev/stockd/raftfsm"
	"stockd.dev/stockd/stock"
)

// Ledger is what the control plane reads of the replicated ledger: a
// sale's row, its orders, the order feed and the lottery's entries. It
// writes only through the engine's proposals.
type Ledger interface {
	SaleLedger
	FeedLedger
	LotteryLedger
	QueueLedger
}

// SaleLedger reads sales and their orders.
type SaleLedger interface {
	SKU(sku string) (stock.SKU, uint64, bool)
	SKUs() ([]stock.SKU, uint64)
	Order(id string) (stock.Order, bool, error)
	Rules() uint64
	// RequestIDs is how many request ids the ledger remembers.
	RequestIDs() int
	AuditAll() (map[string]stock.Audit, error)
	AppliedIndex() uint64
	WaitApplied(ctx context.Context, index uint64) error
	SaleOrders(sku string, state stock.OrderState, after string, fn func(*stock.Order) error) (stock.OrdersSnapshot, error)
	// ArchivedOrderIDs lists an archived sale's orders for its purge.
	ArchivedOrderIDs(sku string, after []byte, limit, scanMax int) (ids []string, next []byte, done bool, err error)
}

// FeedLedger reads the order feed: pages of events after a cursor, a
// channel closed when new ones are published, its state, and lookups for
// retention.
type FeedLedger interface {
	ReadFeed(after stock.Cursor, limit int) (stock.FeedPage, error)
	FeedChanged() <-chan struct{}
	// FeedOn says whether the ledger records the feed at all.
	FeedOn() bool
	FeedStats() (stock.FeedStats, error)
	FeedEvent(seq uint64) (stock.FeedEvent, bool, error)
	FeedCursorBefore(atUnixNano int64) (stock.Cursor, bool, error)
}

// LotteryLedger reads lottery entries: one entrant's standing, every entry
// of a sale, and what a request id produced.
type LotteryLedger interface {
	EntryStatus(sku, user string) (stock.EntryStatus, bool, error)
	SaleEntries(sku string, fn func(*stock.Entry) error) (uint64, error)
	LookupRequest(user, requestID []byte) (raftfsm.RequestRecord, bool)
}

// loopTick paces the control plane's duties (draws due, the feed's and
// the request ids' retention, audits, reclaims).
const loopTick = 50 * time.Millisecond

// Plane is the control plane over one engine. It embeds the engine, so a
// Plane is what the HTTP layer serves: the data plane's methods and the
// control plane's.
type Plane struct {
	*engine.Engine
	ledger Ledger
	cfg    engine.Config
	logger *slog.Logger

	purgeWake  chan struct{} // an archive was applied: the leader takes its orders out
	entryQueue chan *pendingEntry
	drawing    atomic.Bool // the leader is proposing lottery draws

	stop chan struct{}
	// stopped is done once stop is closed, for waits that take a context.
	stopped    context.Context
	endStopped context.CancelFunc
	closeOnce  sync.Once
	wg         sync.WaitGroup

	auditing atomic.Bool // a periodic audit is running

	// The waiting room: joins waiting for a proposal, the long-polls of
	// tickets by sale, the leader's admission state and the counters.
	joinQueue    chan *pendingJoin
	watchMu      sync.Mutex
	watch        map[string]*queueWatchers
	rates        map[string]*admitRate
	admitPerTick atomic.Int64 // admissions one tick of the leader issues at most, for the ETAs
	queueing     atomic.Bool  // the leader is proposing queue ticks
	queueMetrics queueMetrics
}

// New builds the control plane of e over ledger (the one e reads).
func New(e *engine.Engine, ledger Ledger) *Plane {
	p := &Plane{
		Engine: e, ledger: ledger, cfg: e.Config(),
		logger:     e.Logger().With("plane", "control"),
		purgeWake:  make(chan struct{}, 1),
		entryQueue: make(chan *pendingEntry, entryQueueMax),
		joinQueue:  make(chan *pendingJoin, joinQueueMax),
		watch:      map[string]*queueWatchers{},
		rates:      map[string]*admitRate{},
		stop:       make(chan struct{}),
	}
	p.stopped, p.endStopped = context.WithCancel(context.Background())
	return p
}

// Start runs the control plane's goroutines: the lottery's entry batcher,
// the archive's purger, and the loop of draws and feed retention. Call it
// after the engine's Start, once.
func (p *Plane) Start() {
	p.wg.Add(4)
	go p.entrants().Run()
	go p.joiners().Run()
	go p.runPurger()
	go p.run()
}

// Close stops the control plane's goroutines and waits for them; call it
// before the engine's Close. Long-polling feed reads return.
func (p *Plane) Close() {
	p.closeOnce.Do(func() {
		close(p.stop)
		p.endStopped()
	})
	p.wg.Wait()
}

// run is the control plane's periodic duties until Close.
func (p *Plane) run() {
	defer p.wg.Done()
	t := time.NewTicker(loopTick)
	defer t.Stop()
	var lastFeedPrune, lastPrune, lastAudit time.Time
	reclaimTried := map[string]time.Time{}
	var selling sellingRate
	var auditHeld time.Time // when a due audit was first held back; zero: none is
	var lastSlow time.Time
	for {
		select {
		case <-p.stop:
			return
		case <-t.C:
		}
		now := p.cfg.Now()
		p.drawDue(now)
		p.tickQueues(now)
		if now.Sub(lastFeedPrune) >= p.cfg.FeedPruneInterval {
			lastFeedPrune = now
			p.pruneFeed(now)
		}
		busy := selling.busy(p.Engine.Metrics().Answered(), time.Now()) // on the real clock, as the rate is
		gap := p.auditGap()
		if busy && auditHeld.IsZero() && now.Sub(lastAudit) >= gap {
			auditHeld = now
			p.logger.Info("periodic audit held back while the node sells", "answers_per_second_at_least", auditHoldRate, "at_most", auditHoldMax)
		}
		if auditDue(now.Sub(lastAudit), gap, busy) && p.auditing.CompareAndSwap(false, true) {
			if !auditHeld.IsZero() {
				p.logger.Info("periodic audit runs after being held back", "held", now.Sub(auditHeld).Round(time.Second), "still_selling", busy)
				auditHeld = time.Time{}
			}
			// An audit scans every order: off this goroutine, one at a
			// time, so the draws and retention keep their pace.
			lastAudit = now
			p.wg.Add(1)
			go func() {
				defer p.wg.Done()
				defer p.auditing.Store(false)
				start := time.Now()
				p.auditAll()
				p.Engine.Metrics().NoteAudit(time.Since(start))
			}()
		}
		if since := now.Sub(lastPrune); since >= pruneInterval || since >= pruneOverCapInterval && p.overRequestCap() {
			lastPrune = now
			p.pruneRequests(now)
		}
		// Membership duties need proposals; pace them slower.
		if now.Sub(lastSlow) >= min(p.cfg.LeaseIdleReturn/4, 250*time.Millisecond) {
			lastSlow = now
			p.reclaimLostNodes(now, reclaimTried)
		}
	}
}
