package engine

import (
	"hash/maphash"
	"sync"
	"time"
)

// DeductBatch runs reqs as Deduct would, into res (same length), without
// a goroutine for each: every deduct whose units are in the buckets joins
// the commit pipeline at once, then all are awaited together; those that
// must wait for units run on their own goroutines. A gateway's batch of a
// hundred buyers thus costs the node one wait, not a hundred.
func (e *Engine) DeductBatch(reqs []DeductRequest, res []DeductResult) {
	waiters := make([]waiter, len(reqs))
	var slow sync.WaitGroup
	clock := instant{e.cfg.Now(), time.Now()}
	slots := make([]pendingTake, len(reqs))
	reused := reusedInBatch(reqs, e.batchSeed)
	e.prefetchRequests(reqs)
	var caught batchCatchUp
	for i := range reqs {
		req, r := &reqs[i], &res[i]
		*r = DeductResult{}
		req.clock, req.slot, req.catchUp = clock, &slots[i], &caught
		if reused != nil && reused[i] {
			reusedRequestID(r)
			e.metrics.countDeduct(r.Status, req.Hint)
			continue
		}
		s := e.admit(req, r)
		if s == nil {
			e.metrics.countDeduct(r.Status, req.Hint)
			continue
		}
		w := e.startAttempt(s, req, r, false)
		if w.limit == needSlow {
			slow.Add(1)
			req.clock = instant{} // it waits for units: its own clock readings
			go func() {
				defer slow.Done()
				defer e.admission.done()
				e.attempt(s, req, r)
				e.metrics.countDeduct(r.Status, req.Hint)
			}()
			continue
		}
		if w.p == nil {
			e.admission.done()
			e.metrics.countDeduct(r.Status, req.Hint)
		}
		waiters[i] = w
	}
	for i, w := range waiters {
		if w.p == nil {
			continue
		}
		e.awaitPending(w.p, reqs[i].NoWait, w.limit, &res[i])
		e.admission.done()
		e.metrics.countDeduct(res[i].Status, reqs[i].Hint)
	}
	slow.Wait()
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
	var lines [chunk]prefetchLine
	var sum uint64
	for len(reqs) > 0 {
		n := 0
		for i := range min(len(reqs), chunk) {
			if r := &reqs[i]; len(r.RequestID) > 0 {
				lines[n] = e.pendingIDs.lines(r.User, r.RequestID)
				lines[n].ledger = e.ledger.RequestLine(r.User, r.RequestID)
				n++
			}
		}
		for _, l := range lines[:n] {
			sum += l.cur.Load() + l.prev.Load() + l.ledger.Load()
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
		h := requestHash(seed, r.User, r.RequestID) // two pairs of one hash are compared below
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
