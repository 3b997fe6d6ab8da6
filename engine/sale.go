package engine

import (
	"sync/atomic"
	"time"

	"stockd.dev/stockd/internal/queuetoken"
	"stockd.dev/stockd/raftfsm"
	"stockd.dev/stockd/shard"
	"stockd.dev/stockd/stock"
)

// sale is one SKU's node-local selling state. Fields read on the fast path
// are atomics; the rest change only on the FSM goroutine or the leaser.
type sale struct {
	sku             string
	buckets         *shard.Buckets
	startAtUnixNano int64 // immutable after creation
	perUser         int64
	holdTTL         time.Duration
	// entriesCloseAtUnixNano is set for a lottery, which takes entries,
	// not deducts; drawn says its draw is done (or will never be).
	entriesCloseAtUnixNano int64
	drawn                  atomic.Bool
	// queued: a sale behind a waiting room; queueKeys verify its tokens
	// (updated as the ledger rotates them).
	queued    bool
	queueKeys atomic.Pointer[[]queuetoken.Key]

	soldOut       atomic.Bool  // no unit here and none available in the ledger
	closed        atomic.Bool  // the sale was closed: no deduct may win
	refillQueued  atomic.Bool  // a lease request is queued or in flight
	giveQueued    atomic.Bool  // a give-back (another node wants units) is queued or in flight
	lowWatermark  atomic.Int64 // refill when the buckets hold fewer units
	takesInFlight atomic.Int64 // units taken from buckets, not yet resolved by the ledger
	leaseAtLeast  atomic.Int64 // the largest qty a waiting deduct needs; the next lease covers it
	waitingUnits  atomic.Int64 // units the deducts waiting for a refill want, summed
	waitingMulti  atomic.Int64 // waiting deducts of more than one unit
	lastUseNanos  atomic.Int64 // last take or lease grant here; idle leases go back after LeaseIdleReturn
	// returnIndex is the log index of the last idle Return: no other is
	// proposed before this node's ledger has applied it, or a node whose
	// ledger lags would return the same stale lease again at every tick.
	returnIndex atomic.Uint64
	// The sale's tail on this node: the first sold_out answer (0: none
	// since stock last came back) and the last committed win.
	firstSoldOutNanos atomic.Int64
	lastWinNanos      atomic.Int64
	stockChanged      signal
}

// rebuild makes the buckets agree with the ledger: every sale's buckets hold
// leased[me] less the takes in flight. Called at start and after a restore.
func (e *Engine) rebuild() {
	rows, applied := e.ledger.SKUs()
	e.ignoreEventsUpTo.Store(applied)
	for i := range rows {
		s, _ := e.saleFor(&rows[i])
		s.closed.Store(rows[i].Closed())
		s.buckets.Drain()
		if units := rows[i].Leased[e.cfg.NodeID] - s.takesInFlight.Load(); units > 0 {
			s.buckets.Load(units)
		}
		e.updateSoldOut(s)
		s.stockChanged.broadcast()
	}
}

// saleFor returns the engine's sale for a ledger row, creating it if new.
func (e *Engine) saleFor(row *stock.SKU) (*sale, bool) {
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
	if row.Lottery != nil {
		s.entriesCloseAtUnixNano = max(row.Config.EntriesCloseAtUnixNano, 1)
	}
	if s.queued = row.Queue != nil; s.queued {
		s.setQueueKeys(row)
	}
	s.lowWatermark.Store(1)
	s.closed.Store(row.Closed())
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
// cluster's truth: set only when this node's buckets are empty
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
		case raftfsm.EventQueueChanged:
			if s := e.lookupSale([]byte(ev.SKU)); s != nil && s.queued {
				if row, _, ok := e.ledger.SKU(ev.SKU); ok && row.Queue != nil {
					s.setQueueKeys(&row) // a rotation, mostly
				}
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
		case raftfsm.EventSaleClosed:
			s := e.lookupSale([]byte(ev.SKU))
			if s == nil {
				continue
			}
			// The ledger took every lease back: what the buckets hold is
			// no longer this node's, and waiting buyers learn it is over.
			s.closed.Store(true)
			s.buckets.Drain()
			s.stockChanged.broadcast()
			e.logger.Info("sale closed", "sku", ev.SKU, "units_back", ev.Qty)
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
