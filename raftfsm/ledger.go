package raftfsm

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/hashicorp/raft"
	bolt "go.etcd.io/bbolt"
)

// bbolt buckets of the ledger file.
var (
	bucketMeta     = []byte("meta")
	bucketSKUs     = []byte("skus")
	bucketOrders   = []byte("orders")
	bucketRequests = []byte("requests")
	bucketBuyers   = []byte("buyers")
	bucketNodes    = []byte("nodes")

	keyApplied = []byte("applied_index")
)

const (
	ledgerFileName    = "ledger.db"
	ledgerOpenTimeout = 5 * time.Second // waiting for another process's file lock
)

// SKU is one sale's row of the ledger. The conservation law holds for it
// after every applied entry:
//
//	Total == Available + Σ Leased[n] + Held + Sold, every term >= 0
type SKU struct {
	SKU               string           `json:"sku"`
	Total             int64            `json:"total"`
	Available         int64            `json:"available"`
	Leased            map[string]int64 `json:"leased,omitempty"`
	Held              int64            `json:"held"`
	Sold              int64            `json:"sold"`
	Config            SaleConfig       `json:"config"`
	CreatedAtUnixNano int64            `json:"created_at"`
}

// LeasedTotal is Σ Leased[n].
func (s *SKU) LeasedTotal() int64 {
	var n int64
	for _, v := range s.Leased {
		n += v
	}
	return n
}

// Remaining is what buyers can still win: Total − Held − Sold.
func (s *SKU) Remaining() int64 { return s.Total - s.Held - s.Sold }

// CheckLaw returns an error naming the terms when the conservation law or
// non-negativity is broken.
func (s *SKU) CheckLaw() error {
	if s.Total < 0 || s.Available < 0 || s.Held < 0 || s.Sold < 0 {
		return fmt.Errorf("sku %q has a negative term: total %d available %d held %d sold %d",
			s.SKU, s.Total, s.Available, s.Held, s.Sold)
	}
	for n, v := range s.Leased {
		if v < 0 {
			return fmt.Errorf("sku %q: leased[%s] = %d < 0", s.SKU, n, v)
		}
	}
	if sum := s.Available + s.LeasedTotal() + s.Held + s.Sold; sum != s.Total {
		return fmt.Errorf("sku %q breaks conservation: total %d != available %d + leased %d + held %d + sold %d",
			s.SKU, s.Total, s.Available, s.LeasedTotal(), s.Held, s.Sold)
	}
	return nil
}

func (s *SKU) clone() *SKU {
	c := *s
	c.Leased = maps.Clone(s.Leased)
	return &c
}

// EventKind says what an Event reports.
type EventKind uint8

// Events the ledger reports to its Observer after a batch commits.
const (
	EventSaleCreated    EventKind = iota + 1 // a new sale of Qty units
	EventLeaseGranted                        // Qty units of SKU leased to Node
	EventLeaseReturned                       // Qty units of SKU returned by Node
	EventReclaimed                           // all of Node's leases went back to available
	EventStockChanged                        // Available of SKU rose (restock, release)
	EventReplaced                            // the whole state was replaced by a snapshot restore
	EventNodeRegistered                      // Node registered (or changed) its HTTP address
)

// Event is a state change an engine must react to, with the log index that
// caused it.
type Event struct {
	Kind  EventKind
	Index uint64
	Node  string
	SKU   string
	Qty   int64
}

// Observer receives the ledger's events. Applied is called on the FSM
// goroutine after each batch is durable, in log order; it must not block for
// long and must not call back into raft.
type Observer interface {
	Applied(events []Event)
}

// Ledger is the replicated ledger: a raft.BatchingFSM whose state lives in
// bbolt. ApplyBatch, Snapshot and Restore are called by raft on its FSM
// goroutine; the read methods may be called from any goroutine.
type Ledger struct {
	path   string
	logger *slog.Logger

	obsMu    sync.RWMutex
	observer Observer

	mu       sync.RWMutex // guards db swaps in Restore and the mirrors below
	db       *bolt.DB
	applied  uint64
	skus     map[string]*SKU
	requests map[string]string // request id -> order id
	nodes    map[string]string // node id -> HTTP address

	appliedMu sync.Mutex
	appliedCh chan struct{} // closed and replaced whenever applied advances

	// testHookAfterCommit runs between a batch's bbolt commit and the
	// mirrors' update: tests use it to read in that window.
	testHookAfterCommit func()
}

// ErrLedgerClosed is returned by reads after Close.
var ErrLedgerClosed = errors.New("ledger closed")

// OpenLedger opens (or creates) the ledger file in dir and loads its mirrors.
func OpenLedger(dir string, logger *slog.Logger) (*Ledger, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create ledger dir %s: %w", dir, err)
	}
	l := &Ledger{path: filepath.Join(dir, ledgerFileName), logger: logger}
	if err := l.open(); err != nil {
		return nil, err
	}
	return l, nil
}

func (l *Ledger) open() error {
	db, err := bolt.Open(l.path, 0o600, &bolt.Options{Timeout: ledgerOpenTimeout})
	if err != nil {
		return fmt.Errorf("open ledger %s: %w", l.path, err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		for _, name := range [][]byte{bucketMeta, bucketSKUs, bucketOrders, bucketRequests, bucketBuyers, bucketNodes} {
			if _, err := tx.CreateBucketIfNotExists(name); err != nil {
				return err
			}
		}
		return nil
	})
	if err == nil {
		err = l.loadMirrors(db)
	}
	if err != nil {
		db.Close()
		return fmt.Errorf("load ledger %s: %w", l.path, err)
	}
	l.db = db
	return nil
}

func (l *Ledger) loadMirrors(db *bolt.DB) error {
	skus := make(map[string]*SKU)
	requests := make(map[string]string)
	nodes := make(map[string]string)
	var applied uint64
	err := db.View(func(tx *bolt.Tx) error {
		if v := tx.Bucket(bucketMeta).Get(keyApplied); len(v) == 8 {
			applied = binary.BigEndian.Uint64(v)
		}
		err := tx.Bucket(bucketSKUs).ForEach(func(k, v []byte) error {
			var s SKU
			if err := json.Unmarshal(v, &s); err != nil {
				return fmt.Errorf("decode sku %q: %w", k, err)
			}
			skus[s.SKU] = &s
			return nil
		})
		if err != nil {
			return err
		}
		err = tx.Bucket(bucketNodes).ForEach(func(k, v []byte) error {
			nodes[string(k)] = string(v)
			return nil
		})
		if err != nil {
			return err
		}
		return tx.Bucket(bucketRequests).ForEach(func(k, v []byte) error {
			requests[string(k)] = string(v)
			return nil
		})
	})
	if err != nil {
		return err
	}
	l.applied, l.skus, l.requests, l.nodes = applied, skus, requests, nodes
	return nil
}

// SetObserver installs the receiver of events. Call it before raft starts,
// or accept that events before the call are not seen.
func (l *Ledger) SetObserver(o Observer) {
	l.obsMu.Lock()
	l.observer = o
	l.obsMu.Unlock()
}

// Close closes the ledger file.
func (l *Ledger) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.db == nil {
		return nil
	}
	err := l.db.Close()
	l.db = nil
	return err
}

// NodeAddrs returns the HTTP address every registered node gave.
func (l *Ledger) NodeAddrs() map[string]string {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return maps.Clone(l.nodes)
}

// WaitApplied blocks until the ledger holds log index or ctx ends.
func (l *Ledger) WaitApplied(ctx context.Context, index uint64) error {
	for {
		l.appliedMu.Lock()
		if l.appliedCh == nil {
			l.appliedCh = make(chan struct{})
		}
		ch := l.appliedCh
		l.appliedMu.Unlock()
		if l.AppliedIndex() >= index {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("wait for log index %d (ledger at %d): %w", index, l.AppliedIndex(), ctx.Err())
		}
	}
}

func (l *Ledger) notifyApplied() {
	l.appliedMu.Lock()
	if l.appliedCh != nil {
		close(l.appliedCh)
		l.appliedCh = nil
	}
	l.appliedMu.Unlock()
}

// AppliedIndex is the last log index whose effects are in the ledger.
func (l *Ledger) AppliedIndex() uint64 {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.applied
}

// SKU returns a copy of one sale's row and the applied index it reflects.
func (l *Ledger) SKU(sku string) (SKU, uint64, bool) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	s, ok := l.skus[sku]
	if !ok {
		return SKU{}, l.applied, false
	}
	return *s.clone(), l.applied, true
}

// SKUs returns copies of every sale's row, sorted by SKU, and the applied
// index they reflect.
func (l *Ledger) SKUs() ([]SKU, uint64) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	out := make([]SKU, 0, len(l.skus))
	for _, s := range l.skus {
		out = append(out, *s.clone())
	}
	sort.Slice(out, func(i, j int) bool { return out[i].SKU < out[j].SKU })
	return out, l.applied
}

// OrderIDForRequest returns the order a request id produced, if the ledger
// holds one. It is a map probe under a read lock.
func (l *Ledger) OrderIDForRequest(requestID string) (string, bool) {
	l.mu.RLock()
	id, ok := l.requests[requestID]
	l.mu.RUnlock()
	return id, ok
}

// OrderIDForRequestBytes is OrderIDForRequest for a request id the caller
// holds as bytes; it does not allocate.
func (l *Ledger) OrderIDForRequestBytes(requestID []byte) (string, bool) {
	l.mu.RLock()
	id, ok := l.requests[string(requestID)]
	l.mu.RUnlock()
	return id, ok
}

// Order reads one order.
func (l *Ledger) Order(id string) (Order, bool, error) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.db == nil {
		return Order{}, false, ErrLedgerClosed
	}
	var o Order
	var found bool
	err := l.db.View(func(tx *bolt.Tx) error {
		v := tx.Bucket(bucketOrders).Get([]byte(id))
		if v == nil {
			return nil
		}
		found = true
		return json.Unmarshal(v, &o)
	})
	if err != nil {
		return Order{}, false, fmt.Errorf("read order %q: %w", id, err)
	}
	return o, found, nil
}

// Audit is a recount of one SKU: the row, the orders by state, and whether
// both agree with the conservation law.
type Audit struct {
	OK           bool   `json:"ok"`
	Problem      string `json:"problem,omitempty"`
	AppliedIndex uint64 `json:"applied_index"`
	Row          SKU    `json:"row"`
	OrdersHeld   int64  `json:"orders_held"` // units in held orders
	OrdersSold   int64  `json:"orders_sold"` // units in sold orders
	Orders       int64  `json:"orders"`      // order records of the SKU
}

// AuditSKU recounts the orders of one SKU and checks them and the
// conservation law against the row. ok is false when the SKU is unknown.
// Row, orders and applied index are read in one bbolt transaction, so the
// audit sees one consistent state while Apply goes on.
func (l *Ledger) AuditSKU(sku string) (Audit, bool, error) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.db == nil {
		return Audit{}, false, ErrLedgerClosed
	}
	var a Audit
	found := false
	// Orders are keyed by id, not by SKU: a full scan. Audits are rare and
	// the order count is bounded by the stock ever sold.
	err := l.db.View(func(tx *bolt.Tx) error {
		v := tx.Bucket(bucketSKUs).Get([]byte(sku))
		if v == nil {
			return nil
		}
		found = true
		if err := json.Unmarshal(v, &a.Row); err != nil {
			return fmt.Errorf("decode sku %q: %w", sku, err)
		}
		if idx := tx.Bucket(bucketMeta).Get(keyApplied); len(idx) == 8 {
			a.AppliedIndex = binary.BigEndian.Uint64(idx)
		}
		return tx.Bucket(bucketOrders).ForEach(func(_, v []byte) error {
			var o Order
			if err := json.Unmarshal(v, &o); err != nil {
				return err
			}
			if o.SKU != sku {
				return nil
			}
			a.Orders++
			switch o.State {
			case OrderHeld:
				a.OrdersHeld += o.Qty
			case OrderSold:
				a.OrdersSold += o.Qty
			}
			return nil
		})
	})
	if err != nil {
		return Audit{}, true, fmt.Errorf("audit sku %q: %w", sku, err)
	}
	if !found {
		return Audit{}, false, nil
	}
	var problems []error
	if err := a.Row.CheckLaw(); err != nil {
		problems = append(problems, err)
	}
	if a.OrdersHeld != a.Row.Held || a.OrdersSold != a.Row.Sold {
		problems = append(problems, fmt.Errorf("orders held %d sold %d, row held %d sold %d",
			a.OrdersHeld, a.OrdersSold, a.Row.Held, a.Row.Sold))
	}
	a.OK = len(problems) == 0
	if !a.OK {
		a.Problem = errors.Join(problems...).Error()
	}
	return a, true, nil
}

// Apply applies one log entry; raft uses ApplyBatch, this is for the FSM
// interface and for tests.
func (l *Ledger) Apply(log *raft.Log) interface{} {
	return l.ApplyBatch([]*raft.Log{log})[0]
}

// ApplyBatch applies a batch of committed entries in one bbolt transaction,
// so one fsync covers the batch. Entries at or below the stored applied index
// are skipped (they were applied before a restart). It panics when the disk
// fails or an entry would break the conservation law: a node must not go on
// from a state it cannot trust.
func (l *Ledger) ApplyBatch(logs []*raft.Log) []interface{} {
	results := make([]interface{}, len(logs))
	l.mu.RLock()
	db, applied := l.db, l.applied
	l.mu.RUnlock()
	if db == nil {
		panic("BUG: ApplyBatch on a closed ledger")
	}

	a := applier{ledger: l, touched: make(map[string]*SKU)}
	last := applied
	err := db.Update(func(tx *bolt.Tx) error {
		a.tx = tx
		for i, entry := range logs {
			if entry.Index <= applied {
				continue // applied before a restart; its result went to a proposer long gone
			}
			last = entry.Index
			if entry.Type != raft.LogCommand {
				continue
			}
			a.index = entry.Index
			cmd, err := DecodeCommand(entry.Data)
			if err != nil {
				results[i] = &Result{Outcome: OutcomeInvalid, Detail: err.Error()}
				continue
			}
			res, err := a.apply(&cmd)
			if err != nil {
				return fmt.Errorf("apply %s at index %d: %w", cmd.Op, entry.Index, err)
			}
			results[i] = res
		}
		if last == applied {
			return nil
		}
		for sku, s := range a.touched {
			if err := s.CheckLaw(); err != nil {
				panic(fmt.Sprintf("BUG: after index %d: %v", last, err))
			}
			b, err := json.Marshal(s)
			if err != nil {
				return err
			}
			if err := tx.Bucket(bucketSKUs).Put([]byte(sku), b); err != nil {
				return err
			}
		}
		var idx [8]byte
		binary.BigEndian.PutUint64(idx[:], last)
		return tx.Bucket(bucketMeta).Put(keyApplied, idx[:])
	})
	if err != nil {
		panic(fmt.Sprintf("ledger %s: %v", l.path, err))
	}
	if last == applied {
		return results
	}
	if l.testHookAfterCommit != nil {
		l.testHookAfterCommit()
	}

	l.mu.Lock()
	for sku, s := range a.touched {
		l.skus[sku] = s
	}
	for req, order := range a.newRequests {
		l.requests[req] = order
	}
	for node, addr := range a.newNodes {
		l.nodes[node] = addr
	}
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
// rows it touched.
type applier struct {
	ledger      *Ledger
	tx          *bolt.Tx
	index       uint64
	touched     map[string]*SKU
	newRequests map[string]string
	newNodes    map[string]string
	events      []Event
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

func (a *applier) apply(c *Command) (*Result, error) {
	switch c.Op {
	case OpCreateSale:
		return a.createSale(c), nil
	case OpRestock:
		return a.restock(c), nil
	case OpLease:
		return a.lease(c), nil
	case OpReturn:
		return a.giveBack(c), nil
	case OpTake:
		return a.take(c)
	case OpConfirm:
		return a.confirm(c)
	case OpRelease:
		return a.release(c)
	case OpReclaim:
		return a.reclaim(c), nil
	case OpRegister:
		return a.register(c)
	}
	return &Result{Outcome: OutcomeInvalid, Detail: fmt.Sprintf("unknown op %d", c.Op)}, nil
}

func invalid(format string, args ...any) *Result {
	return &Result{Outcome: OutcomeInvalid, Detail: fmt.Sprintf(format, args...)}
}

func (a *applier) createSale(c *Command) *Result {
	if c.SKU == "" || c.Sale == nil || c.Sale.Total < 0 || c.Sale.PerUser < 0 || c.Sale.HoldTTLNanos < 0 {
		return invalid("create_sale needs a sku and a config with non-negative terms")
	}
	if s := a.sku(c.SKU); s != nil {
		if s.Config == *c.Sale {
			return &Result{Outcome: OutcomeSame}
		}
		return &Result{Outcome: OutcomeConflict, Detail: fmt.Sprintf("sku %q exists with another config", c.SKU)}
	}
	s := &SKU{SKU: c.SKU, Total: c.Sale.Total, Available: c.Sale.Total, Config: *c.Sale, CreatedAtUnixNano: c.AtUnixNano}
	a.touched[c.SKU] = s
	a.event(Event{Kind: EventSaleCreated, SKU: c.SKU, Qty: s.Total})
	return &Result{Outcome: OutcomeOK}
}

func (a *applier) restock(c *Command) *Result {
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

func (a *applier) lease(c *Command) *Result {
	if c.Node == "" || c.Qty <= 0 {
		return invalid("lease needs a node and qty > 0")
	}
	s := a.sku(c.SKU)
	if s == nil {
		return &Result{Outcome: OutcomeUnknownSKU}
	}
	grant := min(c.Qty, s.Available)
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

func (a *applier) giveBack(c *Command) *Result {
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

func (a *applier) reclaim(c *Command) *Result {
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

func (a *applier) register(c *Command) (*Result, error) {
	if c.Node == "" || c.Addr == "" {
		return invalid("register needs a node and an address"), nil
	}
	if old := a.tx.Bucket(bucketNodes).Get([]byte(c.Node)); string(old) == c.Addr {
		return &Result{Outcome: OutcomeSame}, nil
	}
	if err := a.tx.Bucket(bucketNodes).Put([]byte(c.Node), []byte(c.Addr)); err != nil {
		return nil, err
	}
	if a.newNodes == nil {
		a.newNodes = make(map[string]string)
	}
	a.newNodes[c.Node] = c.Addr
	a.event(Event{Kind: EventNodeRegistered, Node: c.Node})
	return &Result{Outcome: OutcomeOK}, nil
}

func (a *applier) getOrder(id string) (*Order, error) {
	v := a.tx.Bucket(bucketOrders).Get([]byte(id))
	if v == nil {
		return nil, nil
	}
	var o Order
	if err := json.Unmarshal(v, &o); err != nil {
		return nil, fmt.Errorf("decode order %q: %w", id, err)
	}
	return &o, nil
}

func (a *applier) putOrder(o *Order) error {
	b, err := json.Marshal(o)
	if err != nil {
		return err
	}
	return a.tx.Bucket(bucketOrders).Put([]byte(o.ID), b)
}

func buyerKey(sku, user string) []byte {
	k := make([]byte, 0, len(sku)+1+len(user))
	k = append(k, sku...)
	k = append(k, 0)
	return append(k, user...)
}

func (a *applier) addBought(sku, user string, delta int64) (int64, error) {
	b := a.tx.Bucket(bucketBuyers)
	k := buyerKey(sku, user)
	var n int64
	if v := b.Get(k); len(v) == 8 {
		n = int64(binary.BigEndian.Uint64(v))
	}
	if delta == 0 {
		return n, nil
	}
	n += delta
	if n < 0 {
		panic(fmt.Sprintf("BUG: user %q bought %d of sku %q", user, n, sku))
	}
	if n == 0 {
		return 0, b.Delete(k)
	}
	var v [8]byte
	binary.BigEndian.PutUint64(v[:], uint64(n))
	return n, b.Put(k, v[:])
}

func (a *applier) requestOrder(requestID string) (string, bool) {
	if id, ok := a.newRequests[requestID]; ok {
		return id, true
	}
	return a.ledger.OrderIDForRequest(requestID)
}

func (a *applier) take(c *Command) (*Result, error) {
	if c.Node == "" {
		return invalid("take needs a node"), nil
	}
	res := &Result{Outcome: OutcomeOK, Takes: make([]TakeResult, len(c.Takes))}
	for i := range c.Takes {
		e := &c.Takes[i]
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
			if id, ok := a.requestOrder(e.RequestID); ok {
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
			Node: c.Node, CreatedAtUnixNano: c.AtUnixNano}
		if ttl := s.Config.HoldTTLNanos; ttl > 0 {
			o.State, o.ExpiresAtUnixNano = OrderHeld, c.AtUnixNano+ttl
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
			if err := a.tx.Bucket(bucketRequests).Put([]byte(e.RequestID), []byte(o.ID)); err != nil {
				return nil, err
			}
			if a.newRequests == nil {
				a.newRequests = make(map[string]string)
			}
			a.newRequests[e.RequestID] = o.ID
		}
		r.Outcome, r.Order = OutcomeOK, o
	}
	return res, nil
}

func (a *applier) confirm(c *Command) (*Result, error) {
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
	if c.AtUnixNano > o.ExpiresAtUnixNano {
		return &Result{Outcome: OutcomeExpired, Order: o}, nil
	}
	s := a.sku(o.SKU)
	if s == nil {
		panic(fmt.Sprintf("BUG: order %q names missing sku %q", o.ID, o.SKU))
	}
	s.Held -= o.Qty
	s.Sold += o.Qty
	o.State = OrderSold
	return &Result{Outcome: OutcomeOK, Order: o}, a.putOrder(o)
}

// Release reasons recorded on released orders.
const (
	ReleaseCancelled = "cancelled"
	ReleaseExpired   = "expired"
)

func (a *applier) release(c *Command) (*Result, error) {
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
	if c.Reason == ReleaseExpired && c.AtUnixNano < o.ExpiresAtUnixNano {
		return &Result{Outcome: OutcomeInvalidState, Order: o, Detail: "hold not yet expired"}, nil
	}
	s := a.sku(o.SKU)
	if s == nil {
		panic(fmt.Sprintf("BUG: order %q names missing sku %q", o.ID, o.SKU))
	}
	s.Held -= o.Qty
	s.Available += o.Qty
	o.State, o.ReleaseReason = OrderReleased, c.Reason
	if s.Config.PerUser > 0 {
		if _, err := a.addBought(o.SKU, o.User, -o.Qty); err != nil {
			return nil, err
		}
	}
	a.event(Event{Kind: EventStockChanged, SKU: o.SKU, Qty: o.Qty})
	return &Result{Outcome: OutcomeOK, Order: o}, a.putOrder(o)
}

// Snapshot opens a read transaction: a consistent view of the ledger at the
// applied index, which Persist then streams while Apply goes on.
func (l *Ledger) Snapshot() (raft.FSMSnapshot, error) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.db == nil {
		return nil, ErrLedgerClosed
	}
	tx, err := l.db.Begin(false)
	if err != nil {
		return nil, fmt.Errorf("begin snapshot: %w", err)
	}
	return &ledgerSnapshot{tx: tx}, nil
}

type ledgerSnapshot struct{ tx *bolt.Tx }

func (s *ledgerSnapshot) Persist(sink raft.SnapshotSink) error {
	if _, err := s.tx.WriteTo(sink); err != nil {
		sink.Cancel()
		return fmt.Errorf("write snapshot: %w", err)
	}
	return sink.Close()
}

func (s *ledgerSnapshot) Release() { _ = s.tx.Rollback() }

// Restore replaces the ledger file with a snapshot stream and reloads the
// mirrors; the observer then sees EventReplaced.
func (l *Ledger) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	tmp := l.path + ".restore"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("create %s: %w", tmp, err)
	}
	if _, err := io.Copy(f, rc); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", tmp, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("sync %s: %w", tmp, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("close %s: %w", tmp, err)
	}

	l.mu.Lock()
	if l.db != nil {
		if err := l.db.Close(); err != nil {
			l.mu.Unlock()
			return fmt.Errorf("close ledger for restore: %w", err)
		}
		l.db = nil
	}
	if err := os.Rename(tmp, l.path); err != nil {
		l.mu.Unlock()
		return fmt.Errorf("replace ledger with snapshot: %w", err)
	}
	err = l.open()
	applied := l.applied
	l.mu.Unlock()
	if err != nil {
		return err
	}
	l.notifyApplied()
	l.logger.Info("ledger restored from snapshot", "applied_index", applied)

	l.obsMu.RLock()
	obs := l.observer
	l.obsMu.RUnlock()
	if obs != nil {
		obs.Applied([]Event{{Kind: EventReplaced, Index: applied}})
	}
	return nil
}
