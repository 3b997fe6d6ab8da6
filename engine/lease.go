package engine

import (
	"errors"
	"time"

	"stockd.dev/stockd/raftfsm/command"
	"stockd.dev/stockd/stock"
)

// leasesInFlightMax bounds concurrent Lease proposals (one per SKU at most).
const leasesInFlightMax = 8

// requestRefill queues a lease request for s unless one is queued or in
// flight. Safe from any goroutine; never blocks.
func (e *Engine) requestRefill(s *sale) {
	if !s.refillQueued.CompareAndSwap(false, true) {
		return
	}
	select {
	case e.refills <- s:
	default:
		s.refillQueued.Store(false)
	}
}

// runLeaser proposes queued lease requests and give-backs, a few at a time.
func (e *Engine) runLeaser() {
	defer e.wg.Done()
	slots := make(chan struct{}, leasesInFlightMax)
	for {
		var s *sale
		work := e.lease
		select {
		case s = <-e.refills:
		case s = <-e.giveBacks:
			work = e.giveBack
		case <-e.stop:
			return
		}
		select {
		case slots <- struct{}{}:
		case <-e.stop:
			return
		}
		e.wg.Add(1)
		go func() {
			defer e.wg.Done()
			work(s)
			<-slots
		}()
	}
}

// leaseChunk sizes a lease: a share of what the ledger still has, so that
// chunks shrink toward one unit at the tail and no node strands much stock.
// A node alone in its cluster strands nothing (no other node sells), so
// its chunk is not capped: a burst (a gateway's batch) then finds its
// units in the buckets instead of waiting for lease after lease. Should
// nodes join, their demand makes it give units back as any holder does.
func (e *Engine) leaseChunk(available int64) int64 {
	chunk := max(available/e.cfg.LeaseDivisor, 1)
	if !e.alone() {
		chunk = min(chunk, e.cfg.LeaseChunkMax)
	}
	return min(chunk, available)
}

// alone reports whether this node is the cluster's only voter (and no
// other node ever registered an address in the ledger).
func (e *Engine) alone() bool {
	if len(e.ledger.NodeAddrs()) > 1 {
		return false
	}
	if e.cfg.Cluster == nil {
		return true
	}
	ids, err := e.cfg.Cluster.MemberIDs()
	return err == nil && len(ids) == 1
}

// lease proposes one Lease for s. The granted units reach the buckets when
// the ledger applies the Lease (Applied), not here, so a retried proposal
// cannot load twice. With nothing available while other nodes hold leases,
// the Lease is a demand: the ledger reports it (EventLeaseWanted), the
// holders give part of their units back, and the next Lease gets them.
func (e *Engine) lease(s *sale) {
	// A grant wakes the deducts waiting for it when it applies
	// (Applied); one that granted nothing does not: the poller asks again
	// for them, and wakes them once nothing is left (pollWaiting).
	defer s.refillQueued.Store(false)
	row, _, ok := e.ledger.SKU(s.sku)
	if !ok || row.Closed() {
		return
	}
	demand := row.Available <= 0
	if demand && row.LeasedTotal()-row.Leased[e.cfg.NodeID] <= 0 {
		e.updateSoldOut(s)
		return
	}
	need := max(s.leaseAtLeast.Swap(0), 1) // what the waiting buyers need; they raise it again while they wait
	if demand && s.buckets.Units() >= need {
		return // ask others only once this node cannot serve its own buyers
	}
	want := max(e.leaseChunk(row.Available), need)
	if !demand {
		// What the waiting buyers want, summed, up to half of what is
		// left: a burst gets its units in one lease, and the tail of a
		// sale is not drawn to one node.
		want = max(want, min(s.waitingUnits.Load(), row.Available/2))
		want = min(want, row.Available)
	}
	res, err := e.propose(&command.Lease{Node: e.cfg.NodeID, SKU: s.sku, Want: want})
	if err != nil {
		e.metrics.leaseErrors.Add(1)
		e.logger.Debug("lease not granted", "sku", s.sku, "want", want, "err", err)
		e.pause(leaseRetryBackoff)
		return
	}
	if res.Outcome != stock.OutcomeOK || res.Qty == 0 {
		e.updateSoldOut(s)
		if demand {
			e.pause(demandPace)
		}
	}
}

// pause waits d or until the engine stops.
func (e *Engine) pause(d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-e.stop:
	}
}

// requestGiveBack queues a give-back for s: another node wants units while
// the ledger has none available. Called on the FSM goroutine; never blocks.
func (e *Engine) requestGiveBack(s *sale) {
	if s.buckets.Units() == 0 || !s.giveQueued.CompareAndSwap(false, true) {
		return
	}
	select {
	case e.giveBacks <- s:
	default:
		s.giveQueued.Store(false)
	}
}

// giveBack returns half of what s's buckets hold (at least one unit) to the
// ledger, where the node that asked can lease it.
func (e *Engine) giveBack(s *sale) {
	defer s.giveQueued.Store(false)
	units := s.buckets.Units()
	if units <= 0 {
		return
	}
	got := s.buckets.TakeUpTo((units + 1) / 2)
	if got == 0 {
		return
	}
	// Do not lease the units straight back before this node's own buyers
	// have run dry.
	s.lowWatermark.Store(0)
	res, err := e.propose(&command.Return{Node: e.cfg.NodeID, SKU: s.sku, Qty: got})
	switch {
	case err == nil:
		e.metrics.leaseGivenBack.Add(uint64(res.Qty))
		e.logger.Debug("gave units back on demand", "sku", s.sku, "units", res.Qty)
	case errors.Is(err, ErrOutcomeUnknown):
		e.logger.Warn("give-back outcome unknown; rebuilding buckets from the ledger", "sku", s.sku, "err", err)
		e.rebuildSale(s)
	default:
		s.buckets.Load(got)
		s.stockChanged.broadcast()
	}
}
