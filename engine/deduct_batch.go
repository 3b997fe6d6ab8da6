package engine

import (
	"hash/maphash"
	"sync"
	"time"

	"stockd.dev/stockd/internal/pendingfilter"
)

// DeductBatch runs reqs as Deduct would, into res (same length), without
// a goroutine for each: every deduct whose units are in the buckets joins
// the commit pipeline at once, then all are awaited together. A gateway's
// batch of a hundred buyers thus costs the node one wait, not a hundred.
//
// Items are judged in item order: no later item wins a unit an earlier
// one could have won. Once an item of a SKU must wait for units, the
// later items of that SKU queue behind it on one goroutine a SKU (a
// batchLine), each trying for a unit after the one before it has one or
// has its answer; and once an item of a SKU is turned away for now (429,
// 503), so is every later item of that SKU.
func (e *Engine) DeductBatch(reqs []DeductRequest, res []DeductResult) {
	waiters := make([]waiter, len(reqs))
	clock := instant{e.cfg.Now(), time.Now()}
	slots := make([]pendingTake, len(reqs))
	reused := reusedInBatch(reqs, e.batchSeed)
	e.prefetchRequests(reqs)
	var caught batchCatchUp
	var lines map[string]*batchLine // by SKU; nil until one is needed
	for i := range reqs {
		req, r := &reqs[i], &res[i]
		*r = DeductResult{}
		req.clock, req.slot, req.catchUp = clock, &slots[i], &caught
		if reused != nil && reused[i] {
			reusedRequestID(r)
			e.metrics.countDeduct(r.Status, req.Hint)
			continue
		}
		if l := lines[string(req.SKU)]; l != nil {
			if len(l.items) > 0 {
				l.items = append(l.items, i)
				continue
			}
			l.refuse(e, req, r)
			continue
		}
		s := e.admit(req, r)
		if s == nil {
			e.metrics.countDeduct(r.Status, req.Hint)
			if stopsLine(r.Status) {
				lines = addLine(lines, req.SKU, &batchLine{stop: *r})
			}
			continue
		}
		w := e.startAttempt(s, req, r, false)
		if w.limit == needSlow {
			req.clock = instant{} // it waits for units: its own clock readings
			lines = addLine(lines, req.SKU, &batchLine{sale: s, items: []int{i}})
			continue
		}
		if w.p == nil {
			e.admission.Done()
			e.metrics.countDeduct(r.Status, req.Hint)
		}
		waiters[i] = w
	}
	var slow sync.WaitGroup
	for _, l := range lines {
		if len(l.items) == 0 {
			continue
		}
		slow.Add(1)
		go func() {
			defer slow.Done()
			l.run(e, reqs, res, waiters)
		}()
	}
	slow.Wait()
	for i, w := range waiters {
		if w.p == nil {
			continue
		}
		e.awaitPending(w.p, reqs[i].NoWait, w.limit, &res[i])
		e.admission.Done()
		e.metrics.countDeduct(res[i].Status, reqs[i].Hint)
	}
}

// batchLine is one SKU's items of a batch from the first that had to wait
// for units on, run in item order (DeductBatch); or, with no items, the
// answer that turned an item of the SKU away for now, which every later
// one gets too.
type batchLine struct {
	sale  *sale // the first item's, admitted already
	items []int
	stop  DeductResult
}

func addLine(lines map[string]*batchLine, sku []byte, l *batchLine) map[string]*batchLine {
	if lines == nil {
		lines = make(map[string]*batchLine)
	}
	lines[string(sku)] = l
	return lines
}

// stopsLine reports whether an answer turns an item away for now (so the
// later items of its SKU must not win instead of it).
func stopsLine(s Status) bool {
	return s == StatusRateLimited || s == StatusTryAgain || s == StatusUnavailable
}

// refuse answers an item of a stopped line with the answer that stopped it.
func (l *batchLine) refuse(e *Engine, req *DeductRequest, r *DeductResult) {
	*r = l.stop
	if r.Detail == "" {
		r.Detail = "an earlier item of this batch for this sku was turned away for now; items are judged in order"
	}
	e.metrics.countDeduct(r.Status, req.Hint)
}

// run tries the line's items one after the other, each for a unit (waiting
// for one if need be) before the next; the commits are awaited after,
// all together, by DeductBatch.
func (l *batchLine) run(e *Engine, reqs []DeductRequest, res []DeductResult, waiters []waiter) {
	stopped := false
	for n, i := range l.items {
		req, r := &reqs[i], &res[i]
		if stopped {
			l.refuse(e, req, r)
			continue
		}
		s := l.sale
		if n > 0 {
			req.clock = instant{}
			if s = e.admit(req, r); s == nil {
				e.metrics.countDeduct(r.Status, req.Hint)
				if stopped = stopsLine(r.Status); stopped {
					l.stop = *r
				}
				continue
			}
		}
		w := e.startAttempt(s, req, r, true)
		if w.p == nil {
			e.admission.Done()
			e.metrics.countDeduct(r.Status, req.Hint)
			if stopped = stopsLine(r.Status); stopped {
				l.stop = *r
			}
			continue
		}
		waiters[i] = w
	}
}

// prefetchRequests brings in the filter lines that admit reads to tell
// each new request id from a repeat, for every item before the first is
// judged: those reads then overlap, where judged one by one each waited
// for its own cache misses behind the work of the item before. The hashes
// come first and the reads after, in a loop of a few instructions a line,
// so that many reads are in flight at once. The words read are summed
// into prefetched, so that no compiler drops the reads.
func (e *Engine) prefetchRequests(reqs []DeductRequest) {
	const chunk = 64
	var lines [chunk]pendingfilter.Lines
	var sum uint64
	for len(reqs) > 0 {
		n := 0
		for i := range min(len(reqs), chunk) {
			if r := &reqs[i]; len(r.RequestID) > 0 {
				lines[n] = e.pendingIDs.Lines(r.User, r.RequestID)
				lines[n].Ledger = e.ledger.RequestLine(r.User, r.RequestID)
				n++
			}
		}
		for _, l := range lines[:n] {
			sum += l.Cur.Load() + l.Prev.Load() + l.Ledger.Load()
		}
		reqs = reqs[min(len(reqs), chunk):]
	}
	e.prefetched.Add(sum)
}

// reusedInBatch marks the items whose user and request id an earlier item
// of the batch used with another SKU or qty: items are judged in order,
// and such an item gets request_id_reused whatever became of the earlier
// one (which may still be waiting for units when the later one is
// judged). nil when there is none.
func reusedInBatch(reqs []DeductRequest, seed maphash.Seed) []bool {
	var first map[uint64]int
	var out []bool
	for i := range reqs {
		r := &reqs[i]
		if len(r.RequestID) == 0 {
			continue
		}
		if first == nil {
			first = make(map[uint64]int, len(reqs))
		}
		h := pendingfilter.RequestHash(seed, r.User, r.RequestID) // two pairs of one hash are compared below
		j, seen := first[h]
		if !seen {
			first[h] = i
			continue
		}
		q := &reqs[j]
		if string(q.User) != string(r.User) || string(q.RequestID) != string(r.RequestID) {
			continue // two ids of one hash: the ledger still judges them
		}
		if string(q.SKU) != string(r.SKU) || q.Qty != r.Qty {
			if out == nil {
				out = make([]bool, len(reqs))
			}
			out[i] = true
		}
	}
	return out
}
