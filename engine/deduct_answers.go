package engine

import (
	"stockd.dev/stockd/raftfsm"
	"stockd.dev/stockd/stock"
)

// The answers a deduct gets before it tries for a unit: a repeated request
// id's first answer, sold out, the per-user limit.

// answeredBeforeStock gives the answers that need no unit: a repeated
// request id's first answer, sold out, the per-user limit. It reports
// whether res holds one.
func (e *Engine) answeredBeforeStock(s *sale, req *DeductRequest, res *DeductResult) bool {
	// A repeated request id gets its first answer, sold out or not. A new
	// one is known to be new without a lock (mayBeRepeat).
	if len(req.RequestID) > 0 && e.mayBeRepeat(req) && e.answerRepeat(req, res) {
		return true
	}
	if s.soldOut.Load() {
		// The flag may have been set since the repeat check above, by the
		// commit of this very request id's first attempt (on another
		// node): that attempt's answer wins over sold_out.
		if len(req.RequestID) > 0 && e.mayBeRepeat(req) && e.answerRepeat(req, res) {
			return true
		}
		// Stock may have come back on another node (vouch.go); after a
		// catch-up the take path judges it again on the ledger.
		switch e.vouchAnswer(req, res) {
		case vouchJudge:
			return false
		case vouchDeferred, vouchRefused:
			return true
		}
		res.Status = StatusSoldOut
		e.noteSoldOut(s)
		return true
	}
	// A repeat buyer of a per_user sale is turned away here once the ledger
	// has committed their purchases; the ledger stays the final word for
	// concurrent attempts.
	if s.perUser > 0 && e.overUserLimit(s, req) {
		// The purchase that reached the limit may be this very request
		// id's, committed since the repeat check above: its answer then.
		if len(req.RequestID) > 0 && e.answerRepeat(req, res) {
			return true
		}
		// A hold of theirs may have been cancelled on another node.
		switch e.vouchAnswer(req, res) {
		case vouchJudge:
			if !e.overUserLimit(s, req) {
				return false
			}
		case vouchDeferred, vouchRefused:
			return true
		}
		res.Status = StatusUserLimit
		return true
	}
	return false
}

// overUserLimit reports whether the ledger shows req's buyer past the
// sale's per_user limit with req's units.
func (e *Engine) overUserLimit(s *sale, req *DeductRequest) bool {
	return e.ledger.MayHaveBought(req.SKU, req.User) && e.ledger.BoughtBytes(req.SKU, req.User)+req.Qty > s.perUser
}

// mayBeRepeat reports whether req's request id may have an answer here
// already: an attempt pending on this node, or an order in the ledger.
// False is certain, and costs a few atomic loads: the ledger adds an id to
// its filter before the commit that holds it is visible (and so before any
// sold-out flag it leads to), and an attempt adds its id before it
// registers.
func (e *Engine) mayBeRepeat(req *DeductRequest) bool {
	return e.pendingIDs.MayContain(req.User, req.RequestID) || e.ledger.MayHoldRequest(req.User, req.RequestID)
}

// answerRepeat fills res with the first answer of req's request id, if this
// node or the ledger knows it: its answer when req asks for what the first
// call asked for, else request_id_reused.
func (e *Engine) answerRepeat(req *DeductRequest, res *DeductResult) bool {
	var buf [raftfsm.MaxRequestKeyBytes]byte
	if p, ok := e.pendingReq.getBytes(raftfsm.AppendRequestKey(buf[:0], req.User, req.RequestID)); ok {
		if !p.asksFor(req) {
			reusedRequestID(res)
			return true
		}
		if req.async {
			req.repeatOf = p
			return true
		}
		e.awaitPending(p, req.NoWait, e.repeatWait(), res)
		return true
	}
	return e.answerFromLedger(req, res)
}

func reusedRequestID(res *DeductResult) {
	*res = DeductResult{Status: StatusRequestIDReused,
		Detail: "this user already used this request_id for another sku or qty (or a lottery entry); use a new request_id for a new purchase"}
}

// answerFromLedger fills res with the order the ledger holds for req's
// request id, if any.
func (e *Engine) answerFromLedger(req *DeductRequest, res *DeductResult) bool {
	rec, ok := e.ledger.LookupRequest(req.User, req.RequestID)
	if !ok {
		return false
	}
	if rec.EntrySKU != "" {
		reusedRequestID(res)
		return true
	}
	o, found, err := e.ledger.Order(rec.OrderID)
	if err != nil || !found {
		res.Status, res.Detail = StatusUnavailable, "order of a repeated request id is unreadable"
		return true
	}
	if o.User != string(req.User) || o.SKU != string(req.SKU) || o.Qty != req.Qty {
		// Under the rules before scoped request ids, another user's
		// order can hold this id: never handed to this one.
		reusedRequestID(res)
		return true
	}
	if o.State == stock.OrderHeld {
		// It may have been confirmed or cancelled on another node.
		switch e.vouchAnswer(req, res) {
		case vouchJudge:
			return e.answerFromLedger(req, res)
		case vouchDeferred, vouchRefused:
			return true
		}
	}
	res.Status, res.Order = StatusOK, o
	return true
}
