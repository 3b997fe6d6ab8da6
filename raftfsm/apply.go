package raftfsm

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/maphash"
	"maps"
	"slices"
	"sort"

	"github.com/hashicorp/raft"
	bolt "go.etcd.io/bbolt"
)

// Apply applies one log entry; raft uses ApplyBatch, this is for the FSM
// interface and for tests.
func (l *Ledger) Apply(log *raft.Log) interface{} {
	return l.ApplyBatch([]*raft.Log{log})[0]
}

// ApplyBatch applies a batch of committed entries in memory and hands the
// changes to the persister, which writes them to bbolt behind (see
// behind.go). Entries at or below the applied index are skipped (they
// were applied before a restart). It panics when the disk fails or an
// entry would break the conservation law: a node must not go on from a
// state it cannot trust.
func (l *Ledger) ApplyBatch(logs []*raft.Log) []interface{} {
	results := make([]interface{}, len(logs))
	l.mu.RLock()
	db, applied, bh := l.db, l.applied, l.bh
	l.mu.RUnlock()
	if db == nil {
		panic("BUG: ApplyBatch on a closed ledger")
	}
	if _, changes := bh.lag(); changes > pendingChangesMax {
		// The persister is behind: wait for it rather than grow.
		if err := bh.flush(db); err != nil {
			panic(fmt.Sprintf("ledger %s: %v", l.path, err))
		}
	}
	bh.forgetPersisted()

	a := applier{ledger: l, db: db, bh: bh, batch: map[string]map[string][]byte{}, touched: make(map[string]*SKU),
		requestChanges: map[string]requestChange{}, holdChanges: map[string]int64{},
		boughtChanges: map[string]int64{}, nodeChanges: map[string]string{}}
	defer a.closeTx()
	last := applied
	for i, entry := range logs {
		if entry.Index <= applied {
			continue // applied before a restart; its result went to a proposer long gone
		}
		last = entry.Index
		if entry.Type != raft.LogCommand {
			continue
		}
		a.index = entry.Index
		at, cmd, err := DecodeCommand(entry.Data)
		if err != nil {
			results[i] = &Result{Outcome: OutcomeInvalid, Detail: err.Error()}
			continue
		}
		a.at = at
		res, err := a.apply(cmd)
		if err != nil {
			panic(fmt.Sprintf("ledger %s: apply %s at index %d: %v", l.path, cmd.Op(), entry.Index, err))
		}
		results[i] = res
	}
	if last == applied {
		return results
	}
	for sku, s := range a.touched {
		if err := s.CheckLaw(); err != nil {
			panic(fmt.Sprintf("BUG: after index %d: %v", last, err))
		}
		b, err := json.Marshal(s)
		if err != nil {
			panic(fmt.Sprintf("BUG: encode sku %q: %v", sku, err))
		}
		a.put(bucketSKUs, []byte(sku), b)
	}
	bh.merge(a.batch, last)
	if l.testHookAfterCommit != nil {
		l.testHookAfterCommit()
	}

	l.mu.Lock()
	for sku, s := range a.touched {
		l.skus[sku] = s
	}
	a.updateMirrors()
	l.applied = last
	l.mu.Unlock()
	l.notifyApplied()

	if len(a.events) > 0 {
		l.obsMu.RLock()
		obs := l.observer
		l.obsMu.RUnlock()
		if obs != nil {
			obs.Applied(a.events)
		}
	}
	return results
}

// applier carries one batch's transaction and its working copies of the
// rows it touched; the *Changes maps hold what the in-memory mirrors must
// take on once the transaction has committed.
type applier struct {
	ledger  *Ledger
	db      *bolt.DB
	tx      *bolt.Tx // a read transaction, opened at the first read that pending cannot answer
	bh      *behind
	batch   map[string]map[string][]byte // this batch's changes: bucket -> key -> value (nil: deleted)
	index   uint64
	at      int64 // the proposer's clock for the entry being applied
	touched map[string]*SKU
	events  []Event

	requestChanges map[string]requestChange // request id -> its order, or a deletion
	requestDelta   int64                    // request ids added less those deleted by this batch
	holdChanges    map[string]int64         // held order id -> expires at; -1 deletes
	boughtChanges  map[string]int64         // buyer key -> units; 0 deletes
	nodeChanges    map[string]string        // node id -> HTTP address
}

// get reads key from this batch's changes, then pending, then bbolt. The
// value is valid until the batch ends; a nil value means absent.
func (a *applier) get(bucket, key []byte) ([]byte, error) {
	if v, ok := a.batch[string(bucket)][string(key)]; ok {
		return v, nil
	}
	if v, ok := a.bh.get(bucket, key); ok {
		return v, nil
	}
	tx, err := a.readTx()
	if err != nil {
		return nil, err
	}
	return tx.Bucket(bucket).Get(key), nil
}

func (a *applier) readTx() (*bolt.Tx, error) {
	if a.tx == nil {
		tx, err := a.db.Begin(false)
		if err != nil {
			return nil, fmt.Errorf("read ledger: %w", err)
		}
		a.tx = tx
	}
	return a.tx, nil
}

func (a *applier) closeTx() {
	if a.tx != nil {
		_ = a.tx.Rollback()
		a.tx = nil
	}
}

// put records a change of this batch; value nil deletes. The applier
// keeps value: the caller must not change it afterwards.
func (a *applier) put(bucket, key, value []byte) {
	m := a.batch[string(bucket)]
	if m == nil {
		m = map[string][]byte{}
		a.batch[string(bucket)] = m
	}
	m[string(key)] = value
}

// requestChange is a request id's new record: its order and creation
// time, or (order "") its deletion.
type requestChange struct {
	order string
	at    int64
}

// requestCount is the number of request ids the ledger holds, this
// batch's changes included.
func (a *applier) requestCount() int64 {
	l := a.ledger
	l.mu.RLock()
	defer l.mu.RUnlock()
	return int64(l.requests.len()) + a.requestDelta
}

// updateMirrors applies a committed batch's changes to the mirrors. The
// caller holds l.mu.
func (a *applier) updateMirrors() {
	l := a.ledger
	for req, ch := range a.requestChanges {
		if ch.order == "" {
			l.requests.remove(req, ch.at)
		} else {
			l.requests.add(req, ch.at)
		}
	}
	for id, at := range a.holdChanges {
		if at < 0 {
			delete(l.holds, id)
		} else {
			l.holds[id] = at
		}
	}
	for key, n := range a.boughtChanges {
		if n == 0 {
			delete(l.bought, key)
		} else {
			l.bought[key] = n
			l.buyerFilter.Load().Add(maphash.String(l.reqSeed, key))
		}
	}
	if l.requests.rebuildFilterIfFull() {
		l.reqFilter.Store(l.requests.filter)
	}
	for node, addr := range a.nodeChanges {
		l.nodes[node] = addr
	}
}

func (a *applier) sku(name string) *SKU {
	if s, ok := a.touched[name]; ok {
		return s
	}
	a.ledger.mu.RLock()
	s, ok := a.ledger.skus[name]
	a.ledger.mu.RUnlock()
	if !ok {
		return nil
	}
	c := s.clone()
	a.touched[name] = c
	return c
}

func (a *applier) event(e Event) {
	e.Index = a.index
	a.events = append(a.events, e)
}

func (a *applier) apply(c Command) (*Result, error) {
	switch c := c.(type) {
	case *CreateSale:
		return a.createSale(c), nil
	case *Restock:
		return a.restock(c), nil
	case *Lease:
		return a.lease(c), nil
	case *Return:
		return a.giveBack(c), nil
	case *Take:
		return a.take(c)
	case *Confirm:
		return a.confirm(c)
	case *Release:
		return a.release(c)
	case *Reclaim:
		return a.reclaim(c), nil
	case *Register:
		return a.register(c)
	case *Expire:
		return a.expire(c)
	case *PruneRequests:
		return a.pruneRequests(c)
	}
	return &Result{Outcome: OutcomeInvalid, Detail: fmt.Sprintf("unknown command %T", c)}, nil
}

func invalid(format string, args ...any) *Result {
	return &Result{Outcome: OutcomeInvalid, Detail: fmt.Sprintf(format, args...)}
}

func (a *applier) createSale(c *CreateSale) *Result {
	if c.SKU == "" || c.Sale.Total < 0 || c.Sale.PerUser < 0 || c.Sale.HoldTTLNanos < 0 {
		return invalid("create_sale needs a sku and a config with non-negative terms")
	}
	if s := a.sku(c.SKU); s != nil {
		if s.Config == c.Sale {
			return &Result{Outcome: OutcomeSame}
		}
		return &Result{Outcome: OutcomeConflict, Detail: fmt.Sprintf("sku %q exists with another config", c.SKU)}
	}
	s := &SKU{SKU: c.SKU, Total: c.Sale.Total, Available: c.Sale.Total, Config: c.Sale, CreatedAtUnixNano: a.at}
	a.touched[c.SKU] = s
	a.event(Event{Kind: EventSaleCreated, SKU: c.SKU, Qty: s.Total})
	return &Result{Outcome: OutcomeOK}
}

func (a *applier) restock(c *Restock) *Result {
	if c.Qty <= 0 {
		return invalid("restock qty %d <= 0", c.Qty)
	}
	s := a.sku(c.SKU)
	if s == nil {
		return &Result{Outcome: OutcomeUnknownSKU}
	}
	s.Total += c.Qty
	s.Available += c.Qty
	a.event(Event{Kind: EventStockChanged, SKU: c.SKU, Qty: c.Qty})
	return &Result{Outcome: OutcomeOK, Qty: c.Qty}
}

func (a *applier) lease(c *Lease) *Result {
	if c.Node == "" || c.Want <= 0 {
		return invalid("lease needs a node and want > 0")
	}
	s := a.sku(c.SKU)
	if s == nil {
		return &Result{Outcome: OutcomeUnknownSKU}
	}
	grant := min(c.Want, s.Available)
	if short := c.Want - grant; short > 0 && s.LeasedTotal()-s.Leased[c.Node] > 0 {
		// Others hold units this node's buyers are waiting for: tell the
		// holders, who give part of their lease back.
		a.event(Event{Kind: EventLeaseWanted, Node: c.Node, SKU: c.SKU, Qty: short})
	}
	if grant > 0 {
		s.Available -= grant
		if s.Leased == nil {
			s.Leased = make(map[string]int64)
		}
		s.Leased[c.Node] += grant
		a.event(Event{Kind: EventLeaseGranted, Node: c.Node, SKU: c.SKU, Qty: grant})
	}
	return &Result{Outcome: OutcomeOK, Qty: grant}
}

func (a *applier) giveBack(c *Return) *Result {
	if c.Node == "" || c.Qty <= 0 {
		return invalid("return needs a node and qty > 0")
	}
	s := a.sku(c.SKU)
	if s == nil {
		return &Result{Outcome: OutcomeUnknownSKU}
	}
	back := min(c.Qty, s.Leased[c.Node])
	if back > 0 {
		s.Leased[c.Node] -= back
		if s.Leased[c.Node] == 0 {
			delete(s.Leased, c.Node)
		}
		s.Available += back
		a.event(Event{Kind: EventLeaseReturned, Node: c.Node, SKU: c.SKU, Qty: back})
	}
	return &Result{Outcome: OutcomeOK, Qty: back}
}

func (a *applier) reclaim(c *Reclaim) *Result {
	if c.Node == "" {
		return invalid("reclaim needs a node")
	}
	var total int64
	seen := make(map[string]bool)
	a.ledger.mu.RLock()
	for name := range a.ledger.skus {
		seen[name] = true
	}
	a.ledger.mu.RUnlock()
	for name := range a.touched {
		seen[name] = true
	}
	names := slices.Collect(maps.Keys(seen))
	sort.Strings(names) // deterministic order of writes
	for _, name := range names {
		s := a.sku(name)
		if s == nil || s.Leased[c.Node] == 0 {
			continue
		}
		n := s.Leased[c.Node]
		delete(s.Leased, c.Node)
		s.Available += n
		total += n
	}
	a.event(Event{Kind: EventReclaimed, Node: c.Node, Qty: total})
	return &Result{Outcome: OutcomeOK, Qty: total}
}

func (a *applier) register(c *Register) (*Result, error) {
	if c.Node == "" || c.Addr == "" {
		return invalid("register needs a node and an address"), nil
	}
	old, err := a.get(bucketNodes, []byte(c.Node))
	if err != nil {
		return nil, err
	}
	if string(old) == c.Addr {
		return &Result{Outcome: OutcomeSame}, nil
	}
	a.put(bucketNodes, []byte(c.Node), []byte(c.Addr))
	a.nodeChanges[c.Node] = c.Addr
	a.event(Event{Kind: EventNodeRegistered, Node: c.Node})
	return &Result{Outcome: OutcomeOK}, nil
}

func (a *applier) getOrder(id string) (*Order, error) {
	v, err := a.get(bucketOrders, []byte(id))
	if err != nil || v == nil {
		return nil, err
	}
	o, err := decodeOrderRecord(id, v)
	if err != nil {
		return nil, err
	}
	return &o, nil
}

func (a *applier) putOrder(o *Order) error {
	a.put(bucketOrders, []byte(o.ID), encodeOrderRecord(nil, o))
	return nil
}

// maxKeyBytes bounds the SKU and user parts of a buyer key; longer ids are
// refused at the HTTP boundary well before this.
const maxKeyBytes = 256

// appendBuyerKey appends the buyers-bucket key of (sku, user).
func appendBuyerKey[T ~string | ~[]byte](dst []byte, sku, user T) []byte {
	dst = append(dst, sku...)
	dst = append(dst, 0)
	return append(dst, user...)
}

func (a *applier) addBought(sku, user string, delta int64) (int64, error) {
	k := appendBuyerKey(nil, sku, user)
	v, err := a.get(bucketBuyers, k)
	if err != nil {
		return 0, err
	}
	var n int64
	if len(v) == 8 {
		n = int64(binary.BigEndian.Uint64(v))
	}
	if delta == 0 {
		return n, nil
	}
	n += delta
	if n < 0 {
		panic(fmt.Sprintf("BUG: user %q bought %d of sku %q", user, n, sku))
	}
	a.boughtChanges[string(k)] = n
	if n == 0 {
		a.put(bucketBuyers, k, nil)
		return 0, nil
	}
	a.put(bucketBuyers, k, binary.BigEndian.AppendUint64(nil, uint64(n)))
	return n, nil
}

func (a *applier) requestOrder(requestID string) (string, bool, error) {
	if ch, ok := a.requestChanges[requestID]; ok {
		return ch.order, ch.order != "", nil
	}
	l := a.ledger
	l.mu.RLock()
	at, ok := l.requests.candidate([]byte(requestID))
	l.mu.RUnlock()
	if !ok {
		return "", false, nil
	}
	v, err := a.get(bucketRequestsByTime, requestTimeKey(at, requestID))
	if err != nil || v == nil {
		return "", false, err
	}
	return string(v), true, nil
}

func requestTimeKey(createdAtUnixNano int64, requestID string) []byte {
	k := make([]byte, 8, 8+len(requestID))
	binary.BigEndian.PutUint64(k, uint64(createdAtUnixNano))
	return append(k, requestID...)
}

func (a *applier) rememberRequest(requestID, orderID string, createdAtUnixNano int64) error {
	a.put(bucketRequestsByTime, requestTimeKey(createdAtUnixNano, requestID), []byte(orderID))
	a.requestChanges[requestID] = requestChange{order: orderID, at: createdAtUnixNano}
	a.requestDelta++
	return nil
}

// pruneRequests forgets request ids whose order was created before the
// command's cutoff, then the oldest ones beyond MaxKeep. The orders stay;
// a retry of a forgotten request id is judged as a new deduct.
func (a *applier) pruneRequests(c *PruneRequests) (*Result, error) {
	if c.MaxKeep < 0 {
		return invalid("prune_requests max_keep %d < 0", c.MaxKeep), nil
	}
	tx, err := a.readTx()
	if err != nil {
		return nil, err
	}
	count := a.requestCount()
	var doomed [][]byte
	ascend(tx, a.bh, a.batch[string(bucketRequestsByTime)], bucketRequestsByTime, func(k, _ []byte) bool {
		if len(k) < 8 {
			return true
		}
		created := int64(binary.BigEndian.Uint64(k[:8]))
		overCount := c.MaxKeep > 0 && count-int64(len(doomed)) > c.MaxKeep
		if created >= c.BeforeUnixNano && !overCount {
			return false
		}
		doomed = append(doomed, slices.Clone(k))
		return true
	})
	for _, k := range doomed {
		a.put(bucketRequestsByTime, k, nil)
		a.requestChanges[string(k[8:])] = requestChange{at: int64(binary.BigEndian.Uint64(k[:8]))}
		a.requestDelta--
	}
	return &Result{Outcome: OutcomeOK, Qty: int64(len(doomed))}, nil
}

func (a *applier) take(c *Take) (*Result, error) {
	if c.Node == "" {
		return invalid("take needs a node"), nil
	}
	res := &Result{Outcome: OutcomeOK, Takes: make([]TakeResult, len(c.Entries))}
	for i := range c.Entries {
		e := &c.Entries[i]
		r := &res.Takes[i]
		if e.OrderID == "" || e.Qty <= 0 || e.User == "" {
			r.Outcome = OutcomeInvalid
			continue
		}
		// The same order id again: a re-proposal after an unknown outcome.
		prior, err := a.getOrder(e.OrderID)
		if err != nil {
			return nil, err
		}
		if prior == nil && e.RequestID != "" {
			id, ok, err := a.requestOrder(e.RequestID)
			if err != nil {
				return nil, err
			}
			if ok {
				if prior, err = a.getOrder(id); err != nil {
					return nil, err
				}
				if prior == nil {
					panic(fmt.Sprintf("BUG: request %q names missing order %q", e.RequestID, id))
				}
			}
		}
		if prior != nil {
			r.Outcome, r.Order = OutcomeSame, *prior
			continue
		}
		s := a.sku(e.SKU)
		if s == nil {
			r.Outcome = OutcomeUnknownSKU
			continue
		}
		if s.Leased[c.Node] < e.Qty {
			r.Outcome = OutcomeLeaseShort
			continue
		}
		if s.Config.PerUser > 0 {
			bought, err := a.addBought(e.SKU, e.User, 0)
			if err != nil {
				return nil, err
			}
			if bought+e.Qty > s.Config.PerUser {
				r.Outcome = OutcomeUserLimit
				continue
			}
		}
		s.Leased[c.Node] -= e.Qty
		if s.Leased[c.Node] == 0 {
			delete(s.Leased, c.Node)
		}
		o := Order{ID: e.OrderID, SKU: e.SKU, User: e.User, Qty: e.Qty, RequestID: e.RequestID,
			Node: c.Node, CreatedAtUnixNano: a.at}
		if ttl := s.Config.HoldTTLNanos; ttl > 0 {
			o.State, o.ExpiresAtUnixNano = OrderHeld, a.at+ttl
			s.Held += e.Qty
		} else {
			o.State = OrderSold
			s.Sold += e.Qty
		}
		if err := a.putOrder(&o); err != nil {
			return nil, err
		}
		if s.Config.PerUser > 0 {
			if _, err := a.addBought(e.SKU, e.User, e.Qty); err != nil {
				return nil, err
			}
		}
		if e.RequestID != "" {
			if err := a.rememberRequest(e.RequestID, o.ID, o.CreatedAtUnixNano); err != nil {
				return nil, err
			}
		}
		if o.State == OrderHeld {
			a.holdChanges[o.ID] = o.ExpiresAtUnixNano
		}
		r.Outcome, r.Order = OutcomeOK, o
	}
	return res, nil
}

func (a *applier) confirm(c *Confirm) (*Result, error) {
	o, err := a.getOrder(c.OrderID)
	if err != nil || o == nil {
		return &Result{Outcome: OutcomeNotFound}, err
	}
	switch o.State {
	case OrderSold:
		return &Result{Outcome: OutcomeSame, Order: o}, nil
	case OrderReleased:
		if o.ReleaseReason == ReleaseExpired {
			return &Result{Outcome: OutcomeExpired, Order: o}, nil
		}
		return &Result{Outcome: OutcomeInvalidState, Order: o}, nil
	}
	if a.at > o.ExpiresAtUnixNano {
		// Too late: the hold is over whether or not the leader has
		// proposed its expiry yet. Release it now, so the answer and the
		// order's state agree.
		if err := a.releaseHeld(o, ReleaseExpired); err != nil {
			return nil, err
		}
		return &Result{Outcome: OutcomeExpired, Order: o}, nil
	}
	s := a.sku(o.SKU)
	if s == nil {
		panic(fmt.Sprintf("BUG: order %q names missing sku %q", o.ID, o.SKU))
	}
	s.Held -= o.Qty
	s.Sold += o.Qty
	o.State = OrderSold
	a.holdChanges[o.ID] = -1
	return &Result{Outcome: OutcomeOK, Order: o}, a.putOrder(o)
}

// Release reasons recorded on released orders.
const (
	ReleaseCancelled = "cancelled"
	ReleaseExpired   = "expired"
)

func (a *applier) release(c *Release) (*Result, error) {
	if c.Reason != ReleaseCancelled && c.Reason != ReleaseExpired {
		return invalid("release reason %q", c.Reason), nil
	}
	o, err := a.getOrder(c.OrderID)
	if err != nil || o == nil {
		return &Result{Outcome: OutcomeNotFound}, err
	}
	switch o.State {
	case OrderReleased:
		return &Result{Outcome: OutcomeSame, Order: o}, nil
	case OrderSold:
		return &Result{Outcome: OutcomeInvalidState, Order: o}, nil
	}
	if c.Reason == ReleaseExpired && a.at < o.ExpiresAtUnixNano {
		return &Result{Outcome: OutcomeInvalidState, Order: o, Detail: "hold not yet expired"}, nil
	}
	if err := a.releaseHeld(o, c.Reason); err != nil {
		return nil, err
	}
	return &Result{Outcome: OutcomeOK, Order: o}, nil
}

// releaseHeld turns a held order released: its units go back to available
// and, for a per_user sale, the buyer may buy them again.
func (a *applier) releaseHeld(o *Order, reason string) error {
	if o.State != OrderHeld {
		panic(fmt.Sprintf("BUG: release of order %q in state %s", o.ID, o.State))
	}
	s := a.sku(o.SKU)
	if s == nil {
		panic(fmt.Sprintf("BUG: order %q names missing sku %q", o.ID, o.SKU))
	}
	s.Held -= o.Qty
	s.Available += o.Qty
	o.State, o.ReleaseReason = OrderReleased, reason
	if s.Config.PerUser > 0 {
		if _, err := a.addBought(o.SKU, o.User, -o.Qty); err != nil {
			return err
		}
	}
	a.holdChanges[o.ID] = -1
	a.event(Event{Kind: EventStockChanged, SKU: o.SKU, Qty: o.Qty})
	return a.putOrder(o)
}

// expire releases the listed holds whose deadline has passed at the
// command's time; others (confirmed, cancelled, not yet due) are skipped.
func (a *applier) expire(c *Expire) (*Result, error) {
	var units int64
	for _, id := range c.OrderIDs {
		o, err := a.getOrder(id)
		if err != nil {
			return nil, err
		}
		if o == nil || o.State != OrderHeld || a.at < o.ExpiresAtUnixNano {
			continue
		}
		if err := a.releaseHeld(o, ReleaseExpired); err != nil {
			return nil, err
		}
		units += o.Qty
	}
	return &Result{Outcome: OutcomeOK, Qty: units}, nil
}
