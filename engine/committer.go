package engine

import (
	"context"
	"errors"
	"fmt"
	"time"

	"stockd.dev/stockd/internal/batcher"
	"stockd.dev/stockd/raftfsm/command"
	"stockd.dev/stockd/stock"
)

// committer is the group commit of won takes (batcher): an idle node
// proposes a lone take at once, and a busy one batches whatever piled up
// while its proposals were in flight, up to maxTakeBatchEntries and
// TakeBatchBytesMax encoded; after a batch of more than one take, a node
// in a cluster lingers up to ForwardLinger (ProposeLinger when it leads)
// once its slot frees, for the rest of the wave. Slots come from
// localSlots while this node leads and from forwardSlots while it
// forwards to a leader elsewhere.
func (e *Engine) committer() *batcher.Batcher[*pendingTake] {
	return &batcher.Batcher[*pendingTake]{
		Queue: e.takeQueue, Stop: e.stop, WG: &e.wg,
		Header:   command.TakeHeaderSize(e.cfg.NodeID),
		Size:     func(p *pendingTake) int { return p.entry.EncodedSize() },
		MaxItems: maxTakeBatchEntries, MaxBytes: e.cfg.TakeBatchBytesMax,
		Slots: func() chan struct{} {
			if !e.isLeader() {
				return e.forwardSlots
			}
			return e.localSlots
		},
		Linger:  e.lingerFor,
		Abandon: e.abandon,
		Commit:  e.commitTakes,
		Queued:  func(p *pendingTake) time.Time { return p.entered },
	}
}

// lingerFor is how long a batch about to use slots waits for more takes.
func (e *Engine) lingerFor(slots chan struct{}) time.Duration {
	if slots == e.forwardSlots {
		return e.cfg.ForwardLinger
	}
	if e.cfg.ProposeLinger > 0 && len(e.ledger.NodeAddrs()) > 1 {
		return e.cfg.ProposeLinger
	}
	return 0
}

// abandon answers a take the committer holds when the engine stops. One
// never proposed gives its unit back and is answered 503: nothing
// happened. One proposed before, back for a retry after an outcome the
// proposer could not tell, may have committed: its buyer is told
// outcome_unknown with its order, and its unit stays out of the buckets,
// as retryTakes leaves the takes it holds at a stop. (It was answered 503
// as well, a false "nothing taken" for a unit the ledger had sold.)
func (e *Engine) abandon(p *pendingTake) {
	if p.attempts > 0 {
		e.fateOpen(p, "the node stopped before the commit; retry with the same request_id on another node")
		return
	}
	s := p.sale
	s.takesInFlight.Add(-p.entry.Qty)
	e.putBack(s, p.hint, p.entry.Qty)
	e.forget(p)
	p.resolve(DeductResult{Status: StatusUnavailable, Detail: "node is shutting down"})
}

// commitTakes proposes one batch and settles its takes. A batch the leader
// refuses for good (too large, malformed) is never sent again as it is: it
// is split in halves, down to single takes, and a single take refused for
// good is answered and its unit put back. Other failures (not sent,
// outcome unknown) are retried with the same order ids.
func (e *Engine) commitTakes(batch []*pendingTake) {
	entries := make([]command.TakeEntry, len(batch))
	for i, p := range batch {
		entries[i] = p.entry
	}
	e.metrics.countBatch(len(batch))
	proposed := time.Now()
	res, err := e.propose(&command.Take{Node: e.cfg.NodeID, Entries: entries})
	e.takes.Verdict()
	e.metrics.countCommit(time.Since(proposed))
	if err == nil && len(res.Takes) != len(batch) {
		e.logger.Error("BUG: take results do not match the batch", "entries", len(batch), "results", len(res.Takes))
		err = fmt.Errorf("%w: %d results for %d takes", ErrOutcomeUnknown, len(res.Takes), len(batch))
	}
	switch {
	case err == nil:
		e.consecutiveFailures.Store(0)
		now := instant{e.cfg.Now(), time.Now()}
		e.noteAnswered(res.Index)
		for i, p := range batch {
			e.settle(p, res.Takes[i], now)
		}
		e.finishWhenApplied(res.Index, batch)
	case (errors.Is(err, ErrTooLarge) || errors.Is(err, ErrRejected)) && len(batch) > 1:
		e.metrics.takeSplits.Add(1)
		e.logger.Warn("take batch refused by the leader; splitting it", "entries", len(batch), "err", err)
		half := len(batch) / 2
		e.commitTakes(batch[:half])
		e.commitTakes(batch[half:])
	case (errors.Is(err, ErrTooLarge) || errors.Is(err, ErrRejected)) && batch[0].attempts > 0:
		// This proposal applied nothing, but an earlier one of the take
		// had an outcome the proposer could not tell.
		e.logger.Error("a take proposed again was refused by the leader; its first proposal may have committed, its buyer is told outcome_unknown",
			"order", batch[0].entry.OrderID, "attempts", batch[0].attempts, "err", err)
		e.fateOpen(batch[0], "the leader refused this take when it was proposed again, and its first proposal may have committed; retry with the same request_id")
	case errors.Is(err, ErrTooLarge) || errors.Is(err, ErrRejected):
		// Nothing was applied: the unit is still this node's.
		p := batch[0]
		e.logger.Error("take refused by the leader for good", "order", p.entry.OrderID, "err", err)
		e.putBack(p.sale, p.hint, p.entry.Qty)
		p.sale.takesInFlight.Add(-p.entry.Qty)
		o := p.pendingOrder()
		o.State, o.ReleaseReason = stock.OrderReleased, "turned_down_rejected"
		e.turnedDown.add(o)
		p.resolve(DeductResult{Status: StatusUnavailable, Detail: "the leader refused this take: " + err.Error()})
		e.forget(p)
	default:
		e.noteCommitFailure()
		e.retryTakes(batch, err)
	}
}

// fateOpen answers a take that will not be proposed again although an
// earlier proposal of it had an outcome the proposer could not tell: that
// one may have committed (or may still), so its buyer is told
// outcome_unknown with its order, never a 503 that says nothing was taken,
// and the unit stays out of the buckets (an idle lease's return gives it
// back if it was not sold). The take is forgotten, so a repeat of its
// request id asks the ledger, where the earlier proposal's fate shows once
// it is settled. Its order stays readable as pending (turnedDown) until
// the ledger holds it: a lookup answered 404 meanwhile was contradicted
// when the earlier proposal committed late.
func (e *Engine) fateOpen(p *pendingTake, detail string) {
	p.sale.takesInFlight.Add(-p.entry.Qty)
	e.forget(p)
	if p.entry.OrderID != "" {
		e.turnedDown.add(p.pendingOrder())
	}
	r := DeductResult{Status: StatusOutcomeUnknown, Detail: detail}
	e.unknownOrder(p, &r)
	p.resolve(r)
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

// settle turns the ledger's verdict on one take into the buyer's answer;
// now is when the verdict came, read once for the batch.
func (e *Engine) settle(p *pendingTake, tr command.TakeResult, now instant) {
	s := p.sale
	qty := p.entry.Qty
	var r DeductResult
	switch tr.Outcome {
	case stock.OutcomeOK:
		r = DeductResult{Status: StatusOK, Order: tr.Order}
		s.lastWinNanos.Store(now.now.UnixNano())
	case stock.OutcomeSame:
		if tr.Order.User != p.entry.User {
			// Under the rules before scoped request ids the ledger
			// answers a request id with whatever order holds it, another
			// user's too: never handed to this one. Nothing was taken.
			e.putBack(s, p.hint, qty)
			reusedRequestID(&r)
			break
		}
		if tr.Order.ID != p.entry.OrderID {
			// The request id already bought elsewhere (another node, or an
			// earlier run): this unit was not needed. A wait=none buyer
			// may hold this node's order id: it now reads the real order.
			e.putBack(s, p.hint, qty)
			e.turnedDown.put(p.entry.OrderID, tr.Order)
		}
		r = DeductResult{Status: StatusOK, Order: tr.Order}
	case stock.OutcomeUserLimit:
		e.putBack(s, p.hint, qty)
		r = DeductResult{Status: StatusUserLimit}
	case stock.OutcomeAdmissionRequired, stock.OutcomeAdmissionInvalid:
		// The ticket was spent (or expired) by the time the take applied.
		e.putBack(s, p.hint, qty)
		r = DeductResult{Status: StatusAdmissionInvalid, Detail: "the admission was used or expired before the take reached the ledger"}
	case stock.OutcomeLeaseShort:
		// The ledger no longer counts this unit as ours (a Reclaim): it is
		// not put back. The Reclaim event rebuilds the buckets.
		e.metrics.leaseShort.Add(1)
		r = DeductResult{Status: StatusUnavailable, Detail: "this node's lease was reclaimed; retry"}
	case stock.OutcomeUnknownSKU:
		r = DeductResult{Status: StatusUnknownSKU}
	case stock.OutcomeRequestIDReused:
		// Another node's take of this user's id, for another SKU or qty,
		// reached the ledger first: this unit was not needed.
		e.putBack(s, p.hint, qty)
		reusedRequestID(&r)
	case stock.OutcomeClosed:
		// The sale closed while the take was in flight: its lease went
		// back to available, this unit with it.
		r = DeductResult{Status: StatusClosed}
	default:
		e.logger.Error("BUG: ledger turned down a take as malformed", "order", p.entry.OrderID, "outcome", tr.Outcome)
		e.putBack(s, p.hint, qty)
		r = DeductResult{Status: StatusUnavailable, Detail: "take rejected as malformed"}
	}
	if !r.Status.Won() {
		// A wait=none buyer may hold this order id: keep its fate readable.
		o := p.pendingOrder()
		o.State, o.ReleaseReason = stock.OrderReleased, "turned_down_"+r.Status.String()
		e.turnedDown.add(o)
	}
	p.resolveAt(r, now.real)
}

// finishWhenApplied ends a settled batch's bookkeeping once this node's
// ledger has applied its index: until then its takes still count as in
// flight (the ledger still counts their units as leased here) and stay
// readable, and repeats of their request ids share their answers. On the
// leader the index is applied already; a follower learns the commit a
// moment after the leader answers, and its buyers need not wait for that.
func (e *Engine) finishWhenApplied(index uint64, batch []*pendingTake) {
	finish := func() {
		for _, p := range batch {
			p.sale.takesInFlight.Add(-p.entry.Qty)
			e.forget(p)
		}
	}
	if e.ledger.AppliedIndex() >= index {
		finish()
		return
	}
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		// A node that stops (or crashed) does not wait for what it
		// will never apply.
		ctx, cancel := context.WithTimeout(e.stopped, applyWaitMax)
		defer cancel()
		if err := e.ledger.WaitApplied(ctx, index); err != nil && e.stopped.Err() == nil {
			e.logger.Warn("a committed take batch is not applied here yet", "index", index, "err", err)
		}
		finish()
	}()
}
