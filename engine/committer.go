package engine

import (
	"time"

	"stockd/raftfsm"
)

// runCommitter is the group commit of DESIGN.md: it waits for a won take,
// waits for a free proposal slot, then sends everything queued by then (up
// to maxTakeBatchEntries) as one Take. There is no timer: an idle node
// proposes a lone take at once, and a busy one batches whatever piled up
// while its proposals were in flight.
func (e *Engine) runCommitter() {
	defer e.wg.Done()
	for {
		var first *pendingTake
		select {
		case first = <-e.takeQueue:
		case <-e.stop:
			return
		}
		select {
		case e.inFlight <- struct{}{}:
		case <-e.stop:
			e.abandon(first)
			return
		}
		batch := make([]*pendingTake, 1, 64)
		batch[0] = first
	gather:
		for len(batch) < maxTakeBatchEntries {
			select {
			case p := <-e.takeQueue:
				batch = append(batch, p)
			default:
				break gather
			}
		}
		e.wg.Add(1)
		go e.proposeTakes(batch)
	}
}

// abandon answers a take that was never proposed and gives its unit back.
func (e *Engine) abandon(p *pendingTake) {
	s := p.sale
	s.takesInFlight.Add(-p.entry.Qty)
	e.putBack(s, p.hint, p.entry.Qty)
	e.forget(p)
	p.resolve(DeductResult{Status: StatusUnavailable, Detail: "node is shutting down"})
}

func (e *Engine) proposeTakes(batch []*pendingTake) {
	defer e.wg.Done()
	entries := make([]raftfsm.TakeEntry, len(batch))
	for i, p := range batch {
		entries[i] = p.entry
	}
	e.metrics.countBatch(len(batch))
	res, err := e.propose(&raftfsm.Command{Op: raftfsm.OpTake, Node: e.cfg.NodeID, Takes: entries})
	<-e.inFlight
	if err == nil && len(res.Takes) != len(batch) {
		e.logger.Error("BUG: take results do not match the batch", "entries", len(batch), "results", len(res.Takes))
		err = raftfsm.ErrOutcomeUnknown
	}
	if err != nil {
		e.noteCommitFailure()
		e.retryTakes(batch, err)
		return
	}
	e.consecutiveFailures.Store(0)
	for i, p := range batch {
		e.settle(p, res.Takes[i])
	}
}

// retryTakes proposes a failed batch again after a backoff, with the same
// order ids: the ledger applies each entry at most once, so a batch that did
// commit after all answers OutcomeSame. Waiting buyers meanwhile get
// outcome_unknown when their CommitWait ends; the real outcome then serves
// their retry.
func (e *Engine) retryTakes(batch []*pendingTake, cause error) {
	e.metrics.takeRetries.Add(uint64(len(batch)))
	attempts := 0
	for _, p := range batch {
		p.attempts++
		attempts = max(attempts, p.attempts)
	}
	backoff := min(takeRetryBackoff<<min(attempts, 6), time.Second)
	if attempts == 1 || attempts%50 == 0 {
		e.logger.Warn("take batch not committed; proposing again", "entries", len(batch), "attempt", attempts, "err", cause)
	}
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		t := time.NewTimer(backoff)
		defer t.Stop()
		select {
		case <-t.C:
		case <-e.stop:
			return // outcome stays unknown; the units stay out of the buckets
		}
		for _, p := range batch {
			select {
			case e.takeQueue <- p:
			case <-e.stop:
				return
			}
		}
	}()
}

// settle turns the ledger's verdict on one take into the buyer's answer.
func (e *Engine) settle(p *pendingTake, tr raftfsm.TakeResult) {
	s := p.sale
	qty := p.entry.Qty
	var r DeductResult
	switch tr.Outcome {
	case raftfsm.OutcomeOK:
		r = DeductResult{Status: StatusOK, Order: tr.Order}
	case raftfsm.OutcomeSame:
		if tr.Order.ID != p.entry.OrderID {
			// The request id already bought elsewhere (another node, or an
			// earlier run): this unit was not needed.
			e.putBack(s, p.hint, qty)
		}
		r = DeductResult{Status: StatusOK, Order: tr.Order}
	case raftfsm.OutcomeUserLimit:
		e.putBack(s, p.hint, qty)
		r = DeductResult{Status: StatusUserLimit}
	case raftfsm.OutcomeLeaseShort:
		// The ledger no longer counts this unit as ours (a Reclaim): it is
		// not put back. The Reclaim event rebuilds the buckets.
		e.metrics.leaseShort.Add(1)
		r = DeductResult{Status: StatusUnavailable, Detail: "this node's lease was reclaimed; retry"}
	case raftfsm.OutcomeUnknownSKU:
		r = DeductResult{Status: StatusUnknownSKU}
	default:
		e.logger.Error("BUG: ledger turned down a take as malformed", "order", p.entry.OrderID, "outcome", tr.Outcome)
		e.putBack(s, p.hint, qty)
		r = DeductResult{Status: StatusUnavailable, Detail: "take rejected as malformed"}
	}
	s.takesInFlight.Add(-qty)
	if !r.Status.Won() {
		// A wait=none buyer may hold this order id: keep its fate readable.
		o := p.pendingOrder()
		o.State, o.ReleaseReason = raftfsm.OrderReleased, "turned_down_"+r.Status.String()
		e.turnedDown.add(o)
	}
	p.resolve(r)
	e.forget(p)
}
