package engine

import (
	"bytes"
	"sync"
	"sync/atomic"
)

// DeductAsync is Deduct for a caller that must not block (an event loop
// serving many connections on one goroutine). When the answer is known
// at once it is in res and DeductAsync reports true. Otherwise it reports
// false and calls done exactly once with the answer, later and on another
// goroutine: the one that settles the take, or the one that ends its wait
// at its limit or when the engine stops. req's byte slices may be reused
// once DeductAsync returns.
func (e *Engine) DeductAsync(req *DeductRequest, res *DeductResult, done func(*DeductResult)) bool {
	*res = DeductResult{}
	s := e.lookupSale(req.SKU)
	if s == nil {
		// A sale this node does not hold yet: admit would wait for a
		// catch-up with the leader (a round trip, up to catchUpWait
		// without a leader), holding up every caller behind this one.
		e.onGoroutine(req, done, e.Deduct)
		return false
	}
	req.async = true
	s = e.admitTo(s, req, res)
	req.async = false
	if req.deferred {
		// Its answer needs a catch-up with the leader first (vouch.go).
		req.deferred = false
		e.onGoroutine(req, done, e.Deduct)
		return false
	}
	var w waiter
	switch {
	case req.repeatOf != nil:
		// A repeat of an attempt pending here: awaited like one that
		// meets it in startAttempt, holding no admission slot.
		w = waiter{p: req.repeatOf, limit: e.repeatWait()}
		req.repeatOf = nil
	case s == nil:
		e.metrics.countDeduct(res.Status, req.Hint)
		return true
	default:
		w = e.startAttempt(s, req, res, false)
	}
	admitted := s != nil
	switch {
	case w.limit == needSlow || (w.p != nil && req.NoWait && !w.p.wasTaken()):
		// It waits for units, or a wait=none repeat for the first
		// attempt's unit: the blocking path.
		e.onGoroutine(req, done, func(own *DeductRequest, r *DeductResult) {
			if w.p != nil {
				e.awaitPending(w.p, own.NoWait, w.limit, r)
			} else {
				e.attempt(s, own, r)
			}
			if admitted {
				e.admission.Done()
			}
			e.metrics.countDeduct(r.Status, own.Hint)
		})
		return false
	case w.p == nil:
	case req.NoWait:
		answerTaken(w.p, res)
	default:
		aw := &asyncWait{e: e, p: w.p, hint: req.Hint, admitted: admitted, done: done}
		if w.p.onDone(aw.settled) {
			e.asyncWaits.add(e.commitWaits.After(w.limit), aw)
			return false
		}
		*res, _ = w.p.outcome()
	}
	if admitted {
		e.admission.Done()
	}
	e.metrics.countDeduct(res.Status, req.Hint)
	return true
}

// asyncWait is a DeductAsync caller waiting for the ledger: answered once,
// by the take's settling or by the end of its wait, whichever is first.
type asyncWait struct {
	e        *Engine
	p        *pendingTake
	hint     uint32
	admitted bool // it holds an admission slot (a repeat does not)
	done     func(*DeductResult)
	answered atomic.Bool
}

// settled answers with the take's outcome (pendingTake.onDone). It runs
// after resolveAt set the result, on its goroutine, and the result never
// changes after that: it is read in place, not copied to the heap.
func (w *asyncWait) settled() {
	if !w.answered.CompareAndSwap(false, true) {
		return
	}
	w.answer(&w.p.result)
}

// ended answers a wait that reached its limit or the engine's stop.
func (w *asyncWait) ended() {
	if !w.answered.CompareAndSwap(false, true) {
		return
	}
	var r DeductResult
	w.e.waitEnded(w.p, &r)
	w.answer(&r)
}

func (w *asyncWait) answer(r *DeductResult) {
	if w.admitted {
		w.e.admission.Done()
	}
	w.e.metrics.countDeduct(r.Status, w.hint)
	w.done(r)
	w.done, w.p = nil, nil
}

// asyncWaits groups the waits of DeductAsync callers by the shared
// deadline channel they end at (deadlines.after): one goroutine a
// deadline grain ends every wait in it still unanswered, instead of a
// timer each.
type asyncWaits struct {
	mu     sync.Mutex
	groups map[<-chan struct{}][]*asyncWait
}

func (a *asyncWaits) add(deadline <-chan struct{}, w *asyncWait) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.groups == nil {
		a.groups = make(map[<-chan struct{}][]*asyncWait)
	}
	g, ok := a.groups[deadline]
	a.groups[deadline] = append(g, w)
	if ok {
		return
	}
	go func() {
		<-deadline
		a.mu.Lock()
		g := a.groups[deadline]
		delete(a.groups, deadline)
		a.mu.Unlock()
		for _, w := range g {
			w.ended()
		}
	}()
}

// onGoroutine runs the blocking path run on a goroutine of its own, with
// its own copy of req (the caller may reuse req's bytes once DeductAsync
// returns), and answers done with its result.
func (e *Engine) onGoroutine(req *DeductRequest, done func(*DeductResult), run func(*DeductRequest, *DeductResult)) {
	own := *req
	own.SKU, own.User, own.RequestID = bytes.Clone(req.SKU), bytes.Clone(req.User), bytes.Clone(req.RequestID)
	own.clock, own.async, own.repeatOf = instant{}, false, nil
	go func() {
		var r DeductResult
		run(&own, &r)
		done(&r)
	}()
}
