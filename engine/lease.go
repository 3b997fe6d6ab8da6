package engine

import (
	"time"

	"stockd/raftfsm"
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

// runLeaser proposes queued lease requests, a few at a time.
func (e *Engine) runLeaser() {
	defer e.wg.Done()
	slots := make(chan struct{}, leasesInFlightMax)
	for {
		var s *sale
		select {
		case s = <-e.refills:
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
			e.lease(s)
			<-slots
		}()
	}
}

// leaseChunk sizes a lease: a share of what the ledger still has, so that
// chunks shrink toward one unit at the tail and no node strands much stock.
func (e *Engine) leaseChunk(available int64) int64 {
	return min(max(available/e.cfg.LeaseDivisor, 1), e.cfg.LeaseChunkMax, available)
}

// lease proposes one Lease for s. The granted units reach the buckets when
// the ledger applies the Lease (Applied), not here, so a retried proposal
// cannot load twice.
func (e *Engine) lease(s *sale) {
	defer func() {
		s.refillQueued.Store(false)
		// Wake deducts waiting on this refill even when it granted nothing,
		// so they re-check and either ask again or answer sold_out.
		s.stockChanged.broadcast()
	}()
	row, _, ok := e.ledger.SKU(s.sku)
	if !ok || row.Available <= 0 {
		return
	}
	want := min(max(e.leaseChunk(row.Available), s.leaseAtLeast.Swap(0)), row.Available)
	res, err := e.propose(&raftfsm.Command{Op: raftfsm.OpLease, Node: e.cfg.NodeID, SKU: s.sku, Qty: want})
	if err != nil {
		e.metrics.leaseErrors.Add(1)
		e.logger.Debug("lease not granted", "sku", s.sku, "want", want, "err", err)
		t := time.NewTimer(leaseRetryBackoff)
		defer t.Stop()
		select {
		case <-t.C:
		case <-e.stop:
		}
		return
	}
	if res.Outcome != raftfsm.OutcomeOK || res.Qty == 0 {
		row, _, _ = e.ledger.SKU(s.sku)
		e.updateSoldOut(s, row.Available)
	}
}
