package engine

import (
	"stockd.dev/stockd/engine/admission"
	"stockd.dev/stockd/raftfsm"
	"stockd.dev/stockd/raftfsm/command"
	"stockd.dev/stockd/stock"
	"sync"
	"time"
)

// asksFor reports whether req asks for what p's take asked for.
func (p *pendingTake) asksFor(req *DeductRequest) bool {
	return p.entry.SKU == string(req.SKU) && p.entry.Qty == req.Qty
}

// pendingTake is one attempt of a deduct from the moment it may take a
// unit: until the unit is taken (markTaken), then until the ledger
// answers (done closes). Repeats of its request id wait on it.
type pendingTake struct {
	sale  *sale
	hint  uint32
	entry command.TakeEntry // OrderID is set when the unit is taken
	// reqKey keys the take in pendingReq (raftfsm.AppendRequestKey of its
	// user and request id); "" without a request id.
	reqKey   string
	created  time.Time
	attempts int

	mu sync.Mutex // guards resolved, done, result, isTaken and taken
	// resolved is set once the ledger has answered (result holds it).
	// done is made only for a caller that blocks until then (whenDone),
	// and closed then: the event loop's deducts and most others never
	// block on it, and a channel each cost an allocation a deduct.
	resolved bool
	done     chan struct{}
	// isTaken is set once the unit is taken and entry.OrderID holds the
	// order's id. taken is made only for a repeat that waits for that
	// (whenTaken), and closed then: most takes have no such repeat, and a
	// channel each cost an allocation and a close on every deduct.
	isTaken bool
	taken   chan struct{}
	result  DeductResult
	// notify1 and notify are called once the ledger answers (onDone):
	// the first apart, as most takes have one, so that it costs no slice.
	notify1 func()
	notify  []func()
	// path is the adaptive limit that counts this take while it waits for
	// the ledger (set once it is queued for commit, at entered on the real
	// clock: the engine's may be a test's).
	path    *admission.Adaptive
	entered time.Time
}

func (e *Engine) newPendingTake(s *sale, req *DeductRequest) *pendingTake {
	p := req.slot
	if p == nil {
		p = new(pendingTake)
	}
	req.slot = nil // a slot serves one take
	*p = pendingTake{
		sale: s, hint: req.Hint, created: req.clock.now, entered: req.clock.real,
		entry: command.TakeEntry{SKU: s.sku, Qty: req.Qty, Ticket: req.ticket},
	}
	if len(req.RequestID) == 0 {
		p.entry.User = string(req.User)
		return p
	}
	// The key holds the user and the request id as its tail: all three
	// share one allocation.
	var buf [raftfsm.MaxRequestKeyBytes]byte
	p.reqKey = string(raftfsm.AppendRequestKey(buf[:0], req.User, req.RequestID))
	tail := p.reqKey[len(p.reqKey)-len(req.User)-len(req.RequestID):]
	p.entry.User, p.entry.RequestID = tail[:len(req.User)], tail[len(req.User):]
	return p
}

// markTaken records that the take's unit is taken, after its order id is
// set, and wakes the repeats waiting for that.
func (p *pendingTake) markTaken() {
	p.mu.Lock()
	p.isTaken = true
	if p.taken != nil {
		close(p.taken)
	}
	p.mu.Unlock()
}

// whenTaken returns a channel closed once the take's unit is taken, or
// already true if it is.
func (p *pendingTake) whenTaken() (_ <-chan struct{}, already bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.isTaken {
		return nil, true
	}
	if p.taken == nil {
		p.taken = make(chan struct{})
	}
	return p.taken, false
}

// wasTaken reports whether the take's unit is taken (its order id set).
func (p *pendingTake) wasTaken() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.isTaken
}

func (p *pendingTake) resolve(r DeductResult) { p.resolveAt(r, time.Time{}) }

// resolveAt is resolve with the real time of the answer, read once for a
// batch of takes (zero: read it now).
func (p *pendingTake) resolveAt(r DeductResult, end time.Time) {
	p.mu.Lock()
	if p.resolved { // answered once: a later answer changes nothing
		p.mu.Unlock()
		return
	}
	p.result = r
	p.resolved = true
	notify1, notify := p.notify1, p.notify
	p.notify1, p.notify = nil, nil
	if p.done != nil {
		close(p.done)
	}
	p.mu.Unlock() // onDone saw resolved, or f is in notify
	if notify1 != nil {
		notify1()
	}
	for _, f := range notify {
		f()
	}
	if p.path != nil {
		if end.IsZero() {
			end = time.Now()
		}
		p.path.Leave(end.Sub(p.entered))
	}
}

// onDone has f called once the ledger answers p, on the goroutine that
// resolves it; false, and f is not called, when it has answered already.
func (p *pendingTake) onDone(f func()) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.resolved {
		return false
	}
	if p.notify1 == nil {
		p.notify1 = f
	} else {
		p.notify = append(p.notify, f)
	}
	return true
}

// closedChan is a channel closed from the start: whenDone's answer for a
// take already answered.
var closedChan = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()

// whenDone returns a channel closed once the ledger answers p.
func (p *pendingTake) whenDone() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.resolved {
		return closedChan
	}
	if p.done == nil {
		p.done = make(chan struct{})
	}
	return p.done
}

func (p *pendingTake) outcome() (DeductResult, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.resolved {
		return DeductResult{}, false
	}
	return p.result, true
}

func (p *pendingTake) pendingOrder() stock.Order {
	return stock.Order{
		ID: p.entry.OrderID, SKU: p.entry.SKU, User: p.entry.User, Qty: p.entry.Qty,
		State: stock.OrderPending, RequestID: p.entry.RequestID, CreatedAtUnixNano: p.created.UnixNano(),
	}
}
