package engine

import (
	"context"
	"fmt"
	"time"
)

// A node answers most calls from its own ledger, which trails the
// leader's by the milliseconds a commit takes to reach it. Some answers
// must not trail: sold_out, user_limit, a held order's state (a GET of
// the order, a repeat of its request id). Once a restock, a cancel or a
// confirm has been answered anywhere, no node may answer as if it had not
// happened. Two rules make that so without a round trip per answer:
//
//   - A node vouches for its view. The leader does while it leads a term
//     whose earlier entries it has applied: every write acknowledged
//     anywhere was applied on it first (a follower's forwarded write is
//     answered after the leader applied it), and a leader that lost its
//     quorum steps down within its lease, before another can be elected.
//     A follower vouches for vouchFor after a catch-up round that started
//     then (it asked the leader for a read index and applied it): the
//     round covers every write acknowledged before it started. Its rounds
//     ask for the index the leader vouches for on its lease (the same
//     argument), not a quorum round, so a window costs the leader nothing
//     but the question. Under load
//     a round runs in the background once half the window is left, so
//     buyers do not wait for one.
//   - A write that can make such an answer untrue (restock, cancel,
//     confirm) is answered ackHold after it applied, on a cluster of more
//     than one node: by then every follower's window that opened before
//     the write has closed, and the rounds that open later cover it.
//
// The answers trust that two nodes' clocks do not run more than a fifth
// apart over ackHold (ackHold is vouchFor and a quarter), as a raft
// leader's lease does.
const (
	vouchFor = 40 * time.Millisecond
	ackHold  = vouchFor + vouchFor/4
)

// mono is the time since the engine started, on the monotonic clock.
func (e *Engine) mono() int64 { return int64(time.Since(e.born)) }

// vouchedFrom extends the follower's window to vouchFor after started,
// the moment a catch-up round that succeeded began.
func (e *Engine) vouchedFrom(started int64) {
	until := started + int64(vouchFor)
	for {
		cur := e.vouchedUntil.Load()
		if cur >= until || e.vouchedUntil.CompareAndSwap(cur, until) {
			return
		}
	}
}

// vouchedNow reports whether this node may answer from its own ledger now
// (a leader of a caught-up term, or a follower within its window), without
// waiting; a follower near the end of its window starts the next round.
func (e *Engine) vouchedNow() bool {
	c := e.cfg.Cluster
	if c == nil {
		return true
	}
	if c.IsLeader() && c.CommitHealthy() {
		return true
	}
	now, until := e.mono(), e.vouchedUntil.Load()
	if now >= until {
		return false
	}
	if now > until-int64(vouchFor)/2 {
		// Half the window left: the next round starts now, so that it
		// ends before this window does even on a busy machine (a lapsed
		// window makes the buyers behind it wait for a round).
		e.refreshVouch()
	}
	return true
}

// vouch is vouchedNow that waits for a catch-up round when the node cannot
// vouch now. caughtUp reports that it waited: the ledger may have moved,
// and the answer must be judged again. An error (ErrUnavailable) means
// the node cannot vouch: its caller answers 503.
func (e *Engine) vouch() (caughtUp bool, err error) {
	if e.vouchedNow() {
		return false, nil
	}
	if e.commitBlocked.Load() {
		return false, fmt.Errorf("%w: this node reaches no leader and cannot tell whether other nodes changed this since", ErrUnavailable)
	}
	if err := e.catchUpWith(context.Background(), true); err != nil {
		return true, err
	}
	return true, nil
}

// Vouch is vouch for reads served outside the engine (the sale's state
// when it reads sold out).
func (e *Engine) Vouch() (caughtUp bool, err error) { return e.vouch() }

// refreshVouch starts a catch-up round unless one runs, without waiting.
func (e *Engine) refreshVouch() {
	c := &e.catchUps
	if c.running.Load() {
		return // the round running now extends the window
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.running.Load() {
		e.joinRoundLocked(true)
	}
}

// vouchVerdict is what a deduct's definite negative answer may do.
type vouchVerdict uint8

const (
	vouchGiven    vouchVerdict = iota // answer it
	vouchJudge                        // the node caught up: judge the deduct again
	vouchDeferred                     // an event loop's deduct: run it on a goroutine (req.deferred)
	vouchRefused                      // res holds 503
)

// vouchAnswer checks that the node may give a deduct a definite negative
// answer from its ledger (vouch), without blocking a DeductAsync caller.
func (e *Engine) vouchAnswer(req *DeductRequest, res *DeductResult) vouchVerdict {
	if e.vouchedNow() {
		return vouchGiven
	}
	if req.async {
		req.deferred = true
		return vouchDeferred
	}
	caughtUp, err := e.vouch()
	switch {
	case err != nil:
		*res = DeductResult{Status: StatusUnavailable, Detail: "cannot confirm this answer with the cluster: " + err.Error()}
		return vouchRefused
	case caughtUp:
		return vouchJudge
	}
	return vouchGiven
}

// holdAck waits ackHold before a write that can make another node's
// answer untrue is answered (see vouchFor); a node alone answers at once.
func (e *Engine) holdAck() {
	if e.cfg.Cluster == nil || e.alone() {
		return
	}
	select {
	case <-time.After(ackHold):
	case <-e.stop:
	}
}

// noteAnswered records that this node answered a write applied at index:
// its reads wait for their ledger to hold it (ReadFresh).
func (e *Engine) noteAnswered(index uint64) {
	for {
		cur := e.answered.Load()
		if cur >= index || e.answered.CompareAndSwap(cur, index) {
			return
		}
	}
}

// ReadFresh makes the node's ledger fit for a read. By default it holds
// every write this node has answered (a follower answers a take before
// its own ledger applies it), so the node never contradicts itself; with
// linearizable, every write the cluster acknowledged before the call (a
// catch-up round that starts after it). ErrUnavailable when it cannot
// within a second.
func (e *Engine) ReadFresh(ctx context.Context, linearizable bool) error {
	if linearizable {
		return e.catchUp(ctx)
	}
	index := e.answered.Load()
	if e.ledger.AppliedIndex() >= index {
		return nil
	}
	if e.commitBlocked.Load() {
		// Cut off from the leader, it will not learn the commit soon.
		return fmt.Errorf("%w: this node answered a write at log index %d it has not applied, and reaches no leader now", ErrUnavailable, index)
	}
	ctx, cancel := context.WithTimeout(ctx, catchUpWait)
	defer cancel()
	if err := e.ledger.WaitApplied(ctx, index); err != nil {
		return fmt.Errorf("%w: this node answered a write at log index %d it has not applied yet: %v", ErrUnavailable, index, err)
	}
	return nil
}
