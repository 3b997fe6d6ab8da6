package engine

import (
	"stockd.dev/stockd/engine/admission"
	"stockd.dev/stockd/stock"
	"time"
)

// Status is the outcome of a deduct, one per HTTP answer of the contract.
type Status uint8

// Deduct outcomes.
const (
	StatusOK             Status = iota + 1 // committed (wait=commit), or the first answer of a repeated request id
	StatusAccepted                         // won in the buckets, commit pending (wait=none)
	StatusSoldOut                          // no unit left to win
	StatusUserLimit                        // the buyer reached the sale's per_user limit
	StatusNotStarted                       // before start_at
	StatusUnknownSKU                       // no such sale
	StatusBadRequest                       // qty or ids out of range
	StatusUnavailable                      // no lease could be had or the ledger cannot commit
	StatusOutcomeUnknown                   // the commit did not finish in time; retry with the same request id
	StatusRateLimited                      // refused by admission control
	StatusTryAgain                         // other nodes still hold units; none reached this node within LeaseWait
	StatusClosed                           // the sale was closed
	StatusLotterySale                      // the sale is a lottery: enter it instead
	// StatusRequestIDReused: the buyer used this request id for another
	// SKU or qty, or for a lottery entry; nothing changed.
	StatusRequestIDReused
	// StatusAdmissionRequired: a sale behind a waiting room, and no
	// admission token; StatusAdmissionInvalid: a token that does not admit
	// this buyer now (forged, altered, expired, another's, spent, its key
	// rotated out).
	StatusAdmissionRequired
	StatusAdmissionInvalid
)

var statusNames = [...]string{
	StatusOK: "ok", StatusAccepted: "accepted", StatusSoldOut: "sold_out", StatusUserLimit: "user_limit",
	StatusNotStarted: "not_started", StatusUnknownSKU: "unknown_sku", StatusBadRequest: "bad_request",
	StatusUnavailable: "unavailable", StatusOutcomeUnknown: "outcome_unknown", StatusRateLimited: "rate_limited",
	StatusTryAgain: "try_again", StatusClosed: "closed", StatusLotterySale: "lottery_sale",
	StatusRequestIDReused: "request_id_reused", StatusAdmissionRequired: "admission_required",
	StatusAdmissionInvalid: "admission_invalid",
}

func (s Status) String() string {
	if int(s) < len(statusNames) && statusNames[s] != "" {
		return statusNames[s]
	}
	return "unknown"
}

// Won reports whether the buyer holds an order.
func (s Status) Won() bool { return s == StatusOK || s == StatusAccepted }

// statusCount sizes per-status counters.
const statusCount = int(StatusAdmissionInvalid) + 1

// DeductRequest is one buyer's attempt. The byte slices are only read during
// Deduct and may be reused by the caller afterwards.
type DeductRequest struct {
	SKU  []byte
	User []byte
	// RequestID is optional; it makes the deduct idempotent. It is the
	// user's: the same id from another user is another request, and the
	// same user's id with another SKU or qty is refused.
	RequestID []byte
	Qty       int64
	// NoWait answers as soon as the unit is won (wait=none).
	NoWait bool
	// Hint picks the starting bucket; pass something sticky and free, such
	// as a connection id.
	Hint uint32
	// AdmissionToken is the waiting room's token, for a queued sale.
	AdmissionToken []byte

	// ticket is the id of the waiting-room ticket the token admits, once
	// checked: the take spends it.
	ticket string

	// clock, when set, is the time of the batch the deduct came in: one
	// reading of the clocks for all its deducts instead of a few each.
	clock instant
	// slot, when set, is where its pending take goes: a batch allocates
	// them together.
	slot *pendingTake
	// catchUp, when set, is shared by a batch's deducts (batchCatchUp).
	catchUp *batchCatchUp
	// async is set by DeductAsync: a repeat of an attempt pending on this
	// node is not awaited in admit but left in repeatOf for the caller
	// to await without blocking.
	async    bool
	repeatOf *pendingTake
	// deferred is set, with no answer in res, when an async deduct's
	// answer needs a catch-up round first (vouchAnswer): DeductAsync then
	// runs it on a goroutine.
	deferred bool
}

// instant is one reading of the engine's clock (now, a test's in tests)
// and of the real one (for latencies).
type instant struct{ now, real time.Time }

// DeductResult is a deduct's answer, filled in by Deduct.
type DeductResult struct {
	Status Status
	Order  stock.Order // set when Status.Won()
	// StartAt is set with StatusNotStarted.
	StartAt time.Time
	// RetryAfter is set with StatusRateLimited and StatusTryAgain.
	RetryAfter time.Duration
	Detail     string
}

// Deduct tries to sell req.Qty units to req.User. It is the hot path: for a
// loser it reads a few atomics and probes two maps; a winner's unit is taken
// with a CAS and joins the next Take batch. Safe for concurrent use.
func (e *Engine) Deduct(req *DeductRequest, res *DeductResult) {
	*res = DeductResult{}
	e.deduct(req, res)
	e.metrics.countDeduct(res.Status, req.Hint)
}

func (e *Engine) deduct(req *DeductRequest, res *DeductResult) {
	s := e.admit(req, res)
	if s == nil {
		return
	}
	defer e.admission.Done()
	e.attempt(s, req, res)
}

// admit runs the funnel's cheap checks in order (bad input, unknown sale,
// not started, a repeat's first answer, sold out, per-user limit, commit
// breaker, admission) and returns the sale when the deduct may try for a
// unit; otherwise res holds the answer. A sale returned holds an admission
// slot the caller gives back.
func (e *Engine) admit(req *DeductRequest, res *DeductResult) *sale {
	return e.admitTo(e.lookupSale(req.SKU), req, res)
}

// admitTo is admit for the sale of req.SKU already looked up (nil: none
// on this node yet, which waits for a catch-up with the leader).
func (e *Engine) admitTo(s *sale, req *DeductRequest, res *DeductResult) *sale {
	if req.Qty <= 0 || req.Qty > MaxQtyPerDeduct || len(req.User) == 0 {
		res.Status = StatusBadRequest
		return nil
	}
	if s == nil {
		if s = e.saleAfterCatchUp(req, res); s == nil {
			return nil
		}
	}
	if s.closed.Load() {
		res.Status = StatusClosed
		return nil
	}
	if s.entriesCloseAtUnixNano != 0 {
		res.Status = StatusLotterySale
		return nil
	}
	if e.closing.Load() {
		res.Status, res.Detail = StatusUnavailable, "node is shutting down"
		return nil
	}
	// The clock is read only where an answer depends on it (a start time,
	// a rate limit): a clock read costs a sold-out answer a percent or
	// two on a virtual machine.
	now := req.clock.now
	if s.startAtUnixNano != 0 {
		if now.IsZero() {
			now = e.cfg.Now()
		}
		if now.UnixNano() < s.startAtUnixNano {
			res.Status, res.StartAt = StatusNotStarted, time.Unix(0, s.startAtUnixNano)
			return nil
		}
	}
	if e.answeredBeforeStock(s, req, res) {
		return nil
	}
	if s.queued && !e.admittedBy(s, req, &now, res) {
		return nil
	}
	if !req.NoWait && e.commitBlocked.Load() {
		res.Status, res.Detail = StatusUnavailable, "the ledger cannot commit now (no quorum or no leader); retry shortly"
		return nil
	}
	if e.adaptive.Full() {
		res.Status, res.RetryAfter = StatusRateLimited, admission.AdaptiveRetryAfter
		res.Detail = "the ledger commits slower than deducts arrive; retry after the given seconds"
		return nil
	}
	if now.IsZero() && e.admission.RateLimited() {
		now = e.cfg.Now()
	}
	ok, retryAfter := e.admission.Admit(req.Hint, now)
	if !ok {
		res.Status, res.RetryAfter = StatusRateLimited, retryAfter
		return nil
	}
	return s
}

// attempt tries for a unit and, won, hands it to the commit pipeline.
// From here on a request id has one attempt on this node: a repeat that
// arrives meanwhile shares its answer, whatever it turns out to be,
// instead of trying the buckets on its own.
func (e *Engine) attempt(s *sale, req *DeductRequest, res *DeductResult) {
	w := e.startAttempt(s, req, res, true)
	if w.p != nil {
		e.awaitPending(w.p, req.NoWait, w.limit, res)
	}
}

// waiter is an attempt that has an answer coming: a take in the commit
// pipeline (its own, or the first attempt of its request id), to await
// for up to limit. A zero waiter means the answer is already in res.
type waiter struct {
	p     *pendingTake
	limit time.Duration
}

// startAttempt runs attempt up to the wait for the ledger. With slow
// false it does not wait for units either: a take the buckets cannot
// cover now returns needSlow, and nothing was registered for it.
func (e *Engine) startAttempt(s *sale, req *DeductRequest, res *DeductResult, slow bool) (w waiter) {
	if !slow && !s.buckets.Take(req.Hint, req.Qty) {
		return waiter{limit: needSlow}
	}
	taken := !slow
	var p *pendingTake
	if len(req.RequestID) > 0 {
		p = e.newPendingTake(s, req)
		e.pendingIDs.Add(p.entry.User, p.entry.RequestID) // before it is registered: see mayBeRepeat
		if other, mine := e.pendingReq.putIfAbsent(p); !mine {
			if taken {
				e.putBack(s, req.Hint, req.Qty)
			}
			if !other.asksFor(req) {
				reusedRequestID(res)
				return waiter{}
			}
			return waiter{p: other, limit: e.repeatWait()}
		}
	}
	if !taken && !s.buckets.Take(req.Hint, req.Qty) && !e.takeSlow(s, req, res) {
		if p != nil {
			p.resolve(*res)
			e.forget(p)
		}
		return waiter{}
	}
	if p == nil {
		p = e.newPendingTake(s, req)
	}
	if !e.won(s, p, res) {
		return waiter{}
	}
	return waiter{p: p, limit: e.cfg.CommitWait}
}

// repeatWait is how long a repeat waits for the first attempt of its
// request id on this node: that attempt's wait for a unit and its commit.
func (e *Engine) repeatWait() time.Duration { return e.cfg.CommitWait + e.cfg.LeaseWait }

// needSlow is startAttempt's waiter limit for a take that must wait for
// units: the caller runs the whole attempt instead.
const needSlow = -1

// takeSlow runs when the buckets could not cover the take: it asks for
// units and waits for them. It answers sold_out only with the cluster's
// truth: the node's applied ledger has fewer units available and leased to
// any node than the buyer wants, so no node can still sell them. While
// other nodes hold leased units, the lease request asks them for some
// (docs/architecture.md, "Leases"); a buyer still without a unit after LeaseWait gets
// try_again, never a sold_out that is not yet true.
func (e *Engine) takeSlow(s *sale, req *DeductRequest, res *DeductResult) bool {
	// A shared deadline and a shared poll, not a timer and a ticker each:
	// a burst (a batch of deducts) waits here by the thousand.
	deadline := e.deadlines.After(e.cfg.LeaseWait)
	// The next lease covers every waiting buyer, not one chunk: a burst
	// would otherwise wait for refill after refill.
	s.waitingUnits.Add(req.Qty)
	defer s.waitingUnits.Add(-req.Qty)
	if req.Qty > 1 {
		s.waitingMulti.Add(1)
		defer s.waitingMulti.Add(-1)
	}
	// Takes committed on other nodes change what they hold without an
	// event here: the poller looks at the ledger for all waiting buyers
	// and wakes them when their answer may have changed (pollWaiting).
	e.poll.enter()
	defer e.poll.leave()
	for {
		changed := s.stockChanged.wait()
		if s.buckets.Take(req.Hint, req.Qty) {
			return true
		}
		available, leased, closed, ok := e.ledger.SKUAvailability(s.sku)
		if !ok {
			res.Status = StatusUnknownSKU
			return false
		}
		if closed {
			res.Status = StatusClosed
			return false
		}
		if available+leased < req.Qty {
			if e.answerShort(s, req, res, available+leased) {
				return false
			}
			continue // caught up with the cluster: judged again
		}
		for {
			at := s.leaseAtLeast.Load()
			if at >= req.Qty || s.leaseAtLeast.CompareAndSwap(at, req.Qty) {
				break
			}
		}
		e.requestRefill(s)
		select {
		case <-changed:
		case <-deadline:
			res.Status, res.RetryAfter = StatusTryAgain, tryAgainAfter
			res.Detail = "units are still leased to other nodes; retry"
			return false
		case <-e.stop:
			res.Status, res.Detail = StatusUnavailable, "node is shutting down"
			return false
		}
	}
}

// answerShort answers a buyer the ledger has too few units for, unless
// it must be judged again (false: the node caught up with the cluster,
// and stock may have come back).
func (e *Engine) answerShort(s *sale, req *DeductRequest, res *DeductResult, left int64) bool {
	// An earlier attempt of this request id (on another node: on this
	// one, repeats share this attempt) may have taken the last unit: its
	// answer, not sold_out.
	if len(req.RequestID) > 0 && e.answerFromLedger(req, res) {
		return true
	}
	// Stock may have come back on another node (vouch.go).
	switch e.vouchAnswer(req, res) {
	case vouchJudge:
		return false
	case vouchRefused:
		return true
	}
	e.updateSoldOut(s)
	res.Status = StatusSoldOut
	e.noteSoldOut(s)
	if req.Qty > 1 && left > 0 {
		res.Detail = "fewer units left than requested"
	}
	return true
}

// pollEvery is how many poller ticks pass between wake-ups of every
// waiting buyer whatever the ledger shows: a bound on how long one can
// miss a change the poller does not look for.
const pollEvery = 50

// pollWaiting runs on the poller's ticks while buyers wait for stock
// (takeSlow). It reads each such sale's row once, keeps the lease request
// going, and wakes the sale's waiting buyers only when their answer may
// have changed: nothing left to sell or lease (sold out), the sale closed,
// units in the buckets, a buyer of several units waiting (whose answer
// depends on how many are left), or every pollEvery ticks. Waking every
// waiting buyer at every tick, as each polled on its own before, cost a
// burst of 100,000 waiting buyers more CPU than the raft heartbeats could
// spare.
func (e *Engine) pollWaiting(tick uint64) {
	for _, s := range *e.sales.Load() {
		if s.waitingUnits.Load() == 0 {
			continue
		}
		available, leased, closed, ok := e.ledger.SKUAvailability(s.sku)
		if !ok || closed || available+leased == 0 || s.buckets.Units() > 0 || s.waitingMulti.Load() > 0 || tick%pollEvery == 0 {
			s.stockChanged.broadcast()
			continue
		}
		e.requestRefill(s)
	}
}

// won turns a unit taken from the buckets into a pending take queued for
// commit; false when the queue is full (res then holds the answer).
func (e *Engine) won(s *sale, p *pendingTake, res *DeductResult) bool {
	if p.created.IsZero() {
		p.created = e.cfg.Now()
	}
	s.lastUseNanos.Store(p.created.UnixNano())
	p.entry.OrderID = e.nextOrderID()
	p.markTaken()
	qty := p.entry.Qty
	s.takesInFlight.Add(qty)
	e.pendingOrd.putIfAbsent(p)
	if units := s.buckets.Units(); units < s.lowWatermark.Load() {
		e.requestRefill(s)
	}
	if p.entered.IsZero() {
		p.entered = time.Now()
	}
	p.path = e.adaptive
	e.adaptive.Enter()
	select {
	case e.takeQueue <- p:
	default:
		e.forget(p)
		s.takesInFlight.Add(-qty)
		e.putBack(s, p.hint, qty)
		res.Status, res.Detail = StatusUnavailable, "commit queue is full"
		p.resolve(*res) // repeats already waiting on p get the same answer
		return false
	}
	return true
}

// awaitPending answers from a pending take: with wait=none as soon as its
// unit is taken, else when the ledger has answered; past limit with
// outcome_unknown. A repeat's limit covers the first attempt's wait for a
// unit as well as its commit.
func (e *Engine) awaitPending(p *pendingTake, noWait bool, limit time.Duration, res *DeductResult) {
	if r, done := p.outcome(); done {
		*res = r
		return
	}
	var taken <-chan struct{}
	if noWait {
		ch, already := p.whenTaken()
		if already {
			answerTaken(p, res)
			return
		}
		taken = ch
	}
	// One shared channel ends the wait at its limit or when the engine
	// stops or its drain loses the leader (commitWaits): a select over
	// fewer channels costs the hot path less, and the reason is read
	// after.
	select {
	case <-p.whenDone():
		r, _ := p.outcome()
		*res = r
		return
	case <-taken:
		answerTaken(p, res)
		return
	case <-e.commitWaits.After(limit):
	}
	e.waitEnded(p, res)
}

// waitEnded answers a wait for p that ended at its limit, or because the
// engine stops or its drain lost the leader.
func (e *Engine) waitEnded(p *pendingTake, res *DeductResult) {
	if r, done := p.outcome(); done { // the answer came meanwhile
		*res = r
		return
	}
	switch {
	case isClosed(e.stop):
		res.Status, res.Detail = StatusOutcomeUnknown, "the node stopped before the commit; retry with the same request_id on another node"
	case isClosed(e.drainLost):
		res.Status, res.Detail = StatusOutcomeUnknown, "the node is stopping and reaches no leader; retry with the same request_id on another node"
	default:
		res.Status, res.Detail = StatusOutcomeUnknown, "commit did not finish in time; retry with the same request_id"
	}
	e.unknownOrder(p, res)
}

// isClosed reports whether ch is closed (ch is only ever closed, never
// sent on).
func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// answerTaken answers a wait=none deduct whose unit p has taken: the
// ledger's answer if it came already, else 202 with the pending order.
func answerTaken(p *pendingTake, res *DeductResult) {
	if r, done := p.outcome(); done {
		*res = r
		return
	}
	res.Status, res.Order = StatusAccepted, p.pendingOrder()
}

// unknownOrder sets an outcome_unknown answer's order, once its unit was
// taken (the order id is set then).
func (e *Engine) unknownOrder(p *pendingTake, res *DeductResult) {
	if p.wasTaken() {
		res.Order = p.pendingOrder()
	}
}

// noteSoldOut records the sale's first sold_out answer on this node: the
// start of its tail. One atomic load once it is set.
func (e *Engine) noteSoldOut(s *sale) {
	if s.firstSoldOutNanos.Load() == 0 {
		s.firstSoldOutNanos.CompareAndSwap(0, e.cfg.Now().UnixNano())
	}
}

// putBack returns units to the buckets (a take the ledger turned down for a
// reason other than stock) and clears the sold-out flag.
func (e *Engine) putBack(s *sale, hint uint32, qty int64) {
	s.buckets.Put(hint, qty)
	s.soldOut.Store(false)
	s.stockChanged.broadcast()
}

func (e *Engine) forget(p *pendingTake) {
	if p.entry.OrderID != "" {
		e.pendingOrd.remove(p)
	}
	if p.reqKey != "" {
		e.pendingReq.remove(p)
	}
}
