package raftfsm

import (
	"fmt"
	"hash/maphash"
	"slices"
	"sync/atomic"

	"stockd.dev/stockd/internal/wire"
	"stockd.dev/stockd/raftfsm/command"
	"stockd.dev/stockd/raftfsm/orderid"
	"stockd.dev/stockd/raftfsm/store"
	"stockd.dev/stockd/raftfsm/waitroom"
	"stockd.dev/stockd/stock"
)

// orderSeq is orderid.Parse for a caller that needs the owner and the
// sequence only.
func orderSeq(id string) (owner string, seq uint64, ok bool) {
	p, ok := orderid.Parse(id)
	return p.Node, p.Seq, ok
}

// raiseOrderSeq counts order id in high, each node's highest sequence.
func raiseOrderSeq(high map[string]uint64, id string) {
	if owner, seq, ok := orderSeq(id); ok && seq > high[owner] {
		high[owner] = seq
	}
}

// seqWindowBits is how many of a node's latest sequences a seqWindow
// covers.
const seqWindowBits = 4096

// seqWindow remembers which of a node's latest sequences have order ids
// the ledger applied since it opened its file. A node's handlers mint ids
// concurrently, so a take's ids come a little out of order; the window
// tells the ledger that an id below its node's highest is new all the
// same, without a lookup. It is the applying node's own knowledge: it
// decides lookups, never an outcome.
type seqWindow struct {
	floor uint64 // sequences at or below it may have orders the window never saw
	// high is the highest sequence among the node's order ids the ledger
	// holds (or held): a take whose id is above it is new without a
	// lookup, on every node alike (it is rebuilt from the file).
	high uint64
	bits [seqWindowBits / 64]uint64
}

func (w *seqWindow) bit(seq uint64) (*uint64, uint64) {
	return &w.bits[seq/64%uint64(len(w.bits))], 1 << (seq % 64)
}

// unseen says whether seq surely has no order: inside the window, above
// the floor, and not seen.
func (w *seqWindow) unseen(seq uint64) bool {
	if seq <= w.floor || seq > w.high || w.high-seq >= seqWindowBits {
		return false
	}
	word, mask := w.bit(seq)
	return *word&mask == 0
}

// see notes that seq has an order.
func (w *seqWindow) see(seq uint64) {
	if seq > w.high {
		if seq-w.high >= seqWindowBits {
			clear(w.bits[:])
		} else {
			for s := w.high + 1; s < seq; s++ { // the sequences skipped have none
				word, mask := w.bit(s)
				*word &^= mask
			}
		}
		w.high = seq
	}
	if w.high-seq < seqWindowBits {
		word, mask := w.bit(seq)
		*word |= mask
	}
}

// orderSeqsOf is owner's highest sequence and window, made on first use
// (a node with no order yet: nothing below its first sequence is taken).
func (l *Ledger) orderSeqsOf(owner string) *seqWindow {
	w := l.orderSeqs[owner]
	if w == nil {
		w = &seqWindow{}
		l.orderSeqs[owner] = w
	}
	return w
}

func (a *applier) getOrder(id string) (*stock.Order, error) {
	if err := a.flushOrderBlock(); err != nil {
		return nil, err
	}
	o, ok, err := store.ReadOrder(id, func(key []byte, fn func([]byte) error) error {
		v, err := a.get(store.BucketOrders, key)
		if err != nil {
			return err
		}
		return fn(v)
	})
	if err != nil || !ok {
		return nil, err
	}
	return &o, nil
}

// openOrderBlock is the block the entry being applied adds orders to.
type openOrderBlock struct {
	key     string
	added   []byte // the members added, encoded
	scratch []byte
}

// putTakenOrder writes the order a take created: in its block if it is
// sold and place, its id's parts, is not nil (the caller passes them only
// for a sequence no order of its node has, so the member's slot in the
// block is free: a block holds at most 256 members however a node names
// its orders), else as a record of its own.
func (a *applier) putTakenOrder(o *stock.Order, place *orderid.ID) error {
	if place == nil || o.State != stock.OrderSold {
		a.putOrderRecord(o)
		return nil
	}
	if !place.CanonicalSeq() {
		a.putOrderRecord(o)
		return nil
	}
	// A batch's orders mostly share a block: its key is built on the
	// stack and copied only when the block changes.
	var buf [64]byte
	if key := store.AppendOrderBlockKey(buf[:0], place.Node, place.Seq>>store.OrderBlockBits); string(key) != a.block.key {
		if err := a.flushOrderBlock(); err != nil {
			return err
		}
		a.block.key = string(key)
	}
	a.block.added, a.block.scratch = store.AppendBlockMember(a.block.added, a.block.scratch, byte(place.Seq), place.Random, o)
	return nil
}

// flushOrderBlock writes the open block: its members, then those added.
func (a *applier) flushOrderBlock() error {
	if len(a.block.added) == 0 {
		return nil
	}
	had, err := a.get(store.BucketOrders, []byte(a.block.key))
	if err != nil {
		return err
	}
	v := a.ledger.growBlock(a.block.key, had, a.block.added)
	a.putKey(store.BucketOrders, a.block.key, v)
	a.block.key, a.block.added = "", a.block.added[:0]
	return nil
}

// growingBlocksMax bounds the blocks growBlock keeps growing in place: a
// node fills one block at a time, so this many is room for a cluster's
// nodes and a few blocks a batch's reordered entries touch again.
const growingBlocksMax = 64

// orderBlockBytesHint is the room a block's value starts with: 256
// members of about 60 bytes, so that a block that fills batch after batch
// is allocated once instead of at each doubling.
const orderBlockBytesHint = 16 << 10

// growBlock returns block key's value had with added after it. A block
// gains members batch after batch, up to 256, and copying all it held
// for every batch made a sale's order writes grow with the block (about
// 470 bytes copied a take at 26 takes a batch). When had is the value
// growBlock returned for key last time, added goes into its spare
// capacity instead: the bytes had covers never change, so the write-behind
// and readers still holding had read what they read before. Any other
// value (read from the file, rewritten by an archive, or from before a
// restore) is copied into a new one with room to grow.
func (l *Ledger) growBlock(key string, had, added []byte) []byte {
	if last, ok := l.growingBlocks[key]; ok && len(had) > 0 && len(had) == len(last) && &had[0] == &last[0] {
		v := append(last, added...)
		l.growingBlocks[key] = v
		return v
	}
	if len(had) == 0 {
		had = []byte{store.OrderBlockFormat}
	}
	n := len(had) + len(added)
	v := append(append(make([]byte, 0, max(2*n, orderBlockBytesHint)), had...), added...)
	if l.growingBlocks == nil || len(l.growingBlocks) >= growingBlocksMax {
		l.growingBlocks = make(map[string][]byte, growingBlocksMax)
	}
	l.growingBlocks[key] = v
	return v
}

func (a *applier) putOrder(o *stock.Order) error {
	if owner, seq, ok := orderSeq(o.ID); ok {
		a.ledger.orderSeqsOf(owner).see(seq)
	}
	a.putOrderRecord(o)
	return nil
}

// putOrderRecord is putOrder for a caller that has counted the id's
// sequence itself.
func (a *applier) putOrderRecord(o *stock.Order) {
	size := 2 + 3*wire.MaxVarintBytes + 5*wire.MaxVarintBytes + len(o.SKU) + len(o.User) + len(o.RequestID) + len(o.Node) + len(o.ReleaseReason)
	a.putKey(store.BucketOrders, o.ID, store.EncodeOrderRecord(make([]byte, 0, size), o))
}

func (a *applier) take(c *command.Take) (*command.Result, error) {
	if c.Node == "" {
		return invalid("take needs a node"), nil
	}
	res := &command.Result{Outcome: stock.OutcomeOK, Takes: make([]command.TakeResult, len(c.Entries))}
	if a.feed.on {
		a.feed.events = slices.Grow(a.feed.events, len(c.Entries)) // an event each, mostly
	}
	a.prefetchRequests(c.Entries)
	for i := range c.Entries {
		if err := a.takeEntry(c.Node, &c.Entries[i], &res.Takes[i]); err != nil {
			return nil, err
		}
	}
	if err := a.flushOrderBlock(); err != nil {
		return nil, err
	}
	if err := a.flushRequestGroup(); err != nil {
		return nil, err
	}
	return res, nil
}

// prefetchRequests brings in the request filter's lines that judging the
// entries' request ids reads (as requestIndex.addAll does for the adds):
// a chunk of ids hashed first, then their lines read in a loop of a few
// instructions each, so that the misses overlap.
func (a *applier) prefetchRequests(entries []command.TakeEntry) {
	f := a.ledger.reqFilter.Load()
	if f == nil {
		return
	}
	const chunk = 64
	var words [chunk]*atomic.Uint64
	for len(entries) > 0 {
		n := 0
		for i := range min(len(entries), chunk) {
			if e := &entries[i]; e.RequestID != "" {
				var buf [maxRequestKeyBytes]byte
				words[n] = f.Line(maphash.Bytes(a.ledger.reqSeed, appendRequestKey(buf[:0], e.User, e.RequestID)))
				n++
			}
		}
		for _, w := range words[:n] {
			a.prefetched += w.Load()
		}
		entries = entries[min(len(entries), chunk):]
	}
}

// takeEntry judges one entry of node's Take into r.
func (a *applier) takeEntry(node string, e *command.TakeEntry, r *command.TakeResult) error {
	if e.OrderID == "" || e.OrderID[0] == store.OrderBlockKeyPrefix[0] || e.Qty <= 0 || e.User == "" {
		r.Outcome = stock.OutcomeInvalid
		return nil
	}
	t, err := a.identifyTake(e)
	if err != nil {
		return err
	}
	switch {
	case t.reused:
		r.Outcome = stock.OutcomeRequestIDReused
		// As for a closed sale, an id the ledger may have held is not
		// reported: it may be a re-proposal of an order an archive took
		// out. (The node that minted it still answers its buyer.)
		if t.fresh {
			a.turnedDown(node, e, r.Outcome)
		}
		return nil
	case t.prior != nil:
		r.Outcome, r.Order = stock.OutcomeSame, *t.prior
		return nil
	}
	s, outcome, err := a.takeAllowed(node, e, t.fresh)
	if err != nil || s == nil {
		r.Outcome = outcome
		return err
	}
	o, err := a.createTaken(node, e, s, &t)
	if err != nil {
		return err
	}
	r.Outcome, r.Order = stock.OutcomeOK, o
	return nil
}

// takeIdentity is what a take's ids say before its sale is looked at: is
// it a re-proposal of an order, a repeat of a request id, or new.
type takeIdentity struct {
	id     orderid.ID
	shaped bool       // the id has the engine's shape
	seqs   *seqWindow // its node's sequences, when shaped
	// fresh: above the highest sequence its node minted so far, so surely
	// new (the common case, without a lookup). It decides what a
	// turned-down take reports, so it reads only the highest, the same on
	// every node. newSeq: fresh, or a sequence the window has not seen.
	fresh, newSeq bool
	prior         *stock.Order // the order a re-proposal or a repeat answers
	reused        bool         // the request id asked for another SKU or qty
	reqKey        string       // where the request id is recorded
}

func (a *applier) identifyTake(e *command.TakeEntry) (takeIdentity, error) {
	var t takeIdentity
	t.id, t.shaped = orderid.Parse(e.OrderID)
	if t.shaped {
		t.seqs = a.ledger.orderSeqsOf(t.id.Node)
	}
	t.fresh = t.shaped && t.id.Seq > t.seqs.high
	t.newSeq = t.fresh || t.shaped && t.seqs.unseen(t.id.Seq)
	if !t.newSeq {
		var err error
		if t.prior, err = a.getOrder(e.OrderID); err != nil || t.prior != nil {
			return t, err // the same order id again: a re-proposal after an unknown outcome
		}
	}
	if e.RequestID == "" {
		return t, nil
	}
	rp, err := a.priorRequest(e.User, e.RequestID)
	if err != nil {
		return t, err
	}
	t.reqKey = rp.key
	// Under scoped request ids a repeat must ask for what the first call
	// got: another SKU or qty, or an id the user entered a lottery with,
	// changes nothing.
	t.reused = a.rules >= RulesScopedRequestIDs &&
		(rp.entrySKU != "" || rp.order != nil && (rp.order.SKU != e.SKU || rp.order.Qty != e.Qty))
	if !t.reused {
		t.prior = rp.order
	}
	return t, nil
}

// takeAllowed returns the sale a new take may take from, or nil and the
// outcome that refuses it (reported in the feed as turned down).
func (a *applier) takeAllowed(node string, e *command.TakeEntry, fresh bool) (*stock.SKU, stock.Outcome, error) {
	s := a.sku(e.SKU)
	outcome := stock.OutcomeOK
	switch {
	case s == nil:
		outcome = stock.OutcomeUnknownSKU
	case s.Closed():
		// An id the ledger may have held is not reported: it may be a
		// re-proposal of an order an archive took out.
		if !fresh {
			return nil, stock.OutcomeClosed, nil
		}
		outcome = stock.OutcomeClosed
	case s.Leased[node] < e.Qty:
		outcome = stock.OutcomeLeaseShort
	case s.Config.PerUser > 0:
		bought, err := a.addBought(e.SKU, e.User, 0)
		if err != nil {
			return nil, stock.OutcomeOK, err
		}
		if bought+e.Qty > s.Config.PerUser {
			outcome = stock.OutcomeUserLimit
		}
	}
	if outcome == stock.OutcomeOK && s.Queue != nil {
		var err error
		if outcome, err = waitroom.SpendTake(queueTxn{a}, s, e); err != nil {
			return nil, stock.OutcomeOK, err
		}
	}
	if outcome != stock.OutcomeOK {
		a.turnedDown(node, e, outcome)
		return nil, outcome, nil
	}
	return s, stock.OutcomeOK, nil
}

// createTaken makes the order of a take the ledger allows.
func (a *applier) createTaken(node string, e *command.TakeEntry, s *stock.SKU, t *takeIdentity) (stock.Order, error) {
	s.Leased[node] -= e.Qty
	if s.Leased[node] == 0 {
		delete(s.Leased, node)
	}
	o := stock.Order{ID: e.OrderID, SKU: e.SKU, User: e.User, Qty: e.Qty, RequestID: e.RequestID,
		Node: node, CreatedAtUnixNano: a.at}
	if ttl := s.Config.HoldTTLNanos; ttl > 0 {
		o.State, o.ExpiresAtUnixNano = stock.OrderHeld, a.at+ttl
		s.Held += e.Qty
	} else {
		o.State = stock.OrderSold
		s.Sold += e.Qty
	}
	var place *orderid.ID
	if t.shaped {
		t.seqs.see(t.id.Seq)
		if t.newSeq {
			place = &t.id
		}
	}
	if err := a.putTakenOrder(&o, place); err != nil {
		return o, err
	}
	if s.Config.PerUser > 0 {
		if _, err := a.addBought(e.SKU, e.User, e.Qty); err != nil {
			return o, err
		}
	}
	if t.reqKey != "" {
		a.rememberRequest(t.reqKey, o.ID, o.CreatedAtUnixNano)
	}
	if o.State == stock.OrderHeld {
		a.holdChanges[o.ID] = o.ExpiresAtUnixNano
	}
	a.feedEvent(stock.FeedOrderCreated, &o)
	return o, nil
}

func (a *applier) confirm(c *command.Confirm) (*command.Result, error) {
	o, err := a.getOrder(c.OrderID)
	if err != nil || o == nil {
		return &command.Result{Outcome: stock.OutcomeNotFound}, err
	}
	switch o.State {
	case stock.OrderSold:
		return &command.Result{Outcome: stock.OutcomeSame, Order: o}, nil
	case stock.OrderReleased:
		if o.ReleaseReason == stock.ReleaseExpired {
			return &command.Result{Outcome: stock.OutcomeExpired, Order: o}, nil
		}
		return &command.Result{Outcome: stock.OutcomeInvalidState, Order: o}, nil
	}
	if a.at > o.ExpiresAtUnixNano {
		// Too late: the hold is over whether or not the leader has
		// proposed its expiry yet. Release it now, so the answer and the
		// order's state agree.
		if err := a.releaseHeld(o, stock.ReleaseExpired); err != nil {
			return nil, err
		}
		return &command.Result{Outcome: stock.OutcomeExpired, Order: o}, nil
	}
	s := a.sku(o.SKU)
	if s == nil {
		panic(fmt.Sprintf("BUG: order %q names missing sku %q", o.ID, o.SKU))
	}
	s.Held -= o.Qty
	s.Sold += o.Qty
	o.State = stock.OrderSold
	a.holdChanges[o.ID] = -1
	a.feedEvent(stock.FeedOrderConfirmed, o)
	if err := a.putOrder(o); err != nil {
		return nil, err
	}
	return &command.Result{Outcome: stock.OutcomeOK, Order: o}, a.settleWaitlist(s)
}

func (a *applier) release(c *command.Release) (*command.Result, error) {
	if c.Reason != stock.ReleaseCancelled && c.Reason != stock.ReleaseExpired {
		return invalid("release reason %q", c.Reason), nil
	}
	o, err := a.getOrder(c.OrderID)
	if err != nil || o == nil {
		return &command.Result{Outcome: stock.OutcomeNotFound}, err
	}
	switch o.State {
	case stock.OrderReleased:
		return &command.Result{Outcome: stock.OutcomeSame, Order: o}, nil
	case stock.OrderSold:
		return &command.Result{Outcome: stock.OutcomeInvalidState, Order: o}, nil
	}
	if c.Reason == stock.ReleaseExpired && a.at < o.ExpiresAtUnixNano {
		return &command.Result{Outcome: stock.OutcomeInvalidState, Order: o, Detail: "hold not yet expired"}, nil
	}
	if err := a.releaseHeld(o, c.Reason); err != nil {
		return nil, err
	}
	return &command.Result{Outcome: stock.OutcomeOK, Order: o}, nil
}

// releaseHeld turns a held order released: its units go back to available
// and, for a per_user sale, the buyer may buy them again.
func (a *applier) releaseHeld(o *stock.Order, reason string) error {
	if o.State != stock.OrderHeld {
		panic(fmt.Sprintf("BUG: release of order %q in state %s", o.ID, o.State))
	}
	s := a.sku(o.SKU)
	if s == nil {
		panic(fmt.Sprintf("BUG: order %q names missing sku %q", o.ID, o.SKU))
	}
	s.Held -= o.Qty
	s.Available += o.Qty
	o.State, o.ReleaseReason = stock.OrderReleased, reason
	if s.Config.PerUser > 0 {
		if _, err := a.addBought(o.SKU, o.User, -o.Qty); err != nil {
			return err
		}
	}
	a.holdChanges[o.ID] = -1
	a.event(Event{Kind: EventStockChanged, SKU: o.SKU, Qty: o.Qty})
	a.feedEvent(stock.FeedOrderReleased, o)
	if err := a.putOrder(o); err != nil {
		return err
	}
	// A lottery's released unit goes to the next waitlisted entry.
	return a.settleWaitlist(s)
}

// expire releases the listed holds whose deadline has passed at the
// command's time; others (confirmed, cancelled, not yet due) are skipped.
func (a *applier) expire(c *command.Expire) (*command.Result, error) {
	var units int64
	for _, id := range c.OrderIDs {
		o, err := a.getOrder(id)
		if err != nil {
			return nil, err
		}
		if o == nil || o.State != stock.OrderHeld || a.at < o.ExpiresAtUnixNano {
			continue
		}
		if err := a.releaseHeld(o, stock.ReleaseExpired); err != nil {
			return nil, err
		}
		units += o.Qty
	}
	return &command.Result{Outcome: stock.OutcomeOK, Qty: units}, nil
}
