package raftfsm

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"stockd/internal/hashfilter"

	bolt "go.etcd.io/bbolt"
)

// bbolt buckets of the ledger file.
var (
	bucketMeta   = []byte("meta")
	bucketSKUs   = []byte("skus")
	bucketOrders = []byte("orders")
	bucketBuyers = []byte("buyers")
	bucketNodes  = []byte("nodes")
	// requests maps request ids to their order ids. Keys are the order's
	// creation time (8-byte big-endian unix nanos) then the request id: new
	// ids append at the end of the B+tree instead of dirtying random pages,
	// and pruning by age picks the same ids on every node. Lookups by
	// request id go through the in-memory mirror.
	bucketRequestsByTime = []byte("requests_by_time")

	keyApplied = []byte("applied_index")
)

const (
	ledgerFileName    = "ledger.db"
	ledgerOpenTimeout = 5 * time.Second // waiting for another process's file lock
	// ledgerMmapBytes is mapped up front: bbolt must remap to grow, and a
	// remap waits for every read transaction (audits, snapshot streams), so
	// without headroom a long read would stall Apply. Address space only.
	ledgerMmapBytes = 4 << 30
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
	EventLeaseWanted                         // Node wanted Qty more units of SKU than available; others hold leases
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
	bh       *behind // changes applied and not yet in bbolt, and their persister
	applied  uint64
	skus     map[string]*SKU
	requests *requestIndex // request id -> where its order id is
	// reqSeed hashes request ids and buyer keys, for the whole life of the
	// ledger; reqFilter and buyerFilter answer "surely not" without a lock.
	reqSeed     maphash.Seed
	reqFilter   atomic.Pointer[hashfilter.Filter]
	buyerFilter atomic.Pointer[hashfilter.Filter]
	nodes       map[string]string // node id -> HTTP address
	holds       map[string]int64  // held order id -> expires at (unix nanos)
	bought      map[string]int64  // buyerKey(sku, user) -> units held or sold, for per_user sales

	appliedMu sync.Mutex
	appliedCh chan struct{} // closed and replaced whenever applied advances

	// testHookAfterCommit runs between a batch's hand-over to the persister
	// and the mirrors' update: tests use it to read in that window.
	testHookAfterCommit func()
	// noPersist keeps every change in memory (tests: a crash before the
	// ledger write).
	noPersist bool
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
	l := &Ledger{path: filepath.Join(dir, ledgerFileName), logger: logger, reqSeed: maphash.MakeSeed()}
	if err := l.open(); err != nil {
		return nil, err
	}
	return l, nil
}

func (l *Ledger) open() error {
	db, err := bolt.Open(l.path, 0o600, &bolt.Options{Timeout: ledgerOpenTimeout, InitialMmapSize: ledgerMmapBytes})
	if err != nil {
		return fmt.Errorf("open ledger %s: %w", l.path, err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		for _, name := range [][]byte{bucketMeta, bucketSKUs, bucketOrders, bucketBuyers, bucketNodes, bucketRequestsByTime} {
			if _, err := tx.CreateBucketIfNotExists(name); err != nil {
				return err
			}
		}
		return nil
	})
	if err == nil {
		err = l.loadMirrors(db)
		dropResidentPages(db)
	}
	if err != nil {
		db.Close()
		return fmt.Errorf("load ledger %s: %w", l.path, err)
	}
	l.db = db
	l.bh = newBehind(l.applied)
	l.bh.noPersist = l.noPersist
	l.bh.start(db, func(err error) {
		// The disk failed under the ledger: going on would answer from
		// state that can never be written.
		panic(fmt.Sprintf("ledger %s: %v", l.path, err))
	})
	return nil
}

// Flush writes every applied change to bbolt now (the persister does so
// on its own within persistInterval). Safe from any goroutine.
func (l *Ledger) Flush() error {
	l.mu.RLock()
	db, bh := l.db, l.bh
	l.mu.RUnlock()
	if db == nil {
		return ErrLedgerClosed
	}
	return bh.flush(db)
}

// PersistLag is how far bbolt is behind the applied state: log entries,
// and changes waiting.
func (l *Ledger) PersistLag() (entries uint64, changes int) {
	l.mu.RLock()
	bh := l.bh
	l.mu.RUnlock()
	if bh == nil {
		return 0, 0
	}
	return bh.lag()
}

func (l *Ledger) loadMirrors(db *bolt.DB) error {
	skus := make(map[string]*SKU)
	requests := newRequestIndex(l.reqSeed)
	buyers := hashfilter.New(buyerFilterLog2Bits)
	nodes := make(map[string]string)
	holds := make(map[string]int64)
	bought := make(map[string]int64)
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
		err = tx.Bucket(bucketBuyers).ForEach(func(k, v []byte) error {
			if len(v) == 8 {
				bought[string(k)] = int64(binary.BigEndian.Uint64(v))
				buyers.Add(maphash.Bytes(l.reqSeed, k))
			}
			return nil
		})
		if err != nil {
			return err
		}
		err = tx.Bucket(bucketOrders).ForEach(func(k, v []byte) error {
			o, err := decodeOrderRecord(string(k), v)
			if err != nil {
				return err
			}
			if o.State == OrderHeld {
				holds[o.ID] = o.ExpiresAtUnixNano
			}
			return nil
		})
		if err != nil {
			return err
		}
		return tx.Bucket(bucketRequestsByTime).ForEach(func(k, v []byte) error {
			if len(k) > 8 {
				requests.add(string(k[8:]), int64(binary.BigEndian.Uint64(k[:8])))
			}
			return nil
		})
	})
	if err != nil {
		return err
	}
	l.applied, l.skus, l.requests, l.nodes, l.holds, l.bought = applied, skus, requests, nodes, holds, bought
	l.reqFilter.Store(requests.filter)
	l.buyerFilter.Store(buyers)
	return nil
}

// SetObserver installs the receiver of events. Call it before raft starts,
// or accept that events before the call are not seen.
func (l *Ledger) SetObserver(o Observer) {
	l.obsMu.Lock()
	l.observer = o
	l.obsMu.Unlock()
}

// Close writes what is still pending and closes the ledger file.
func (l *Ledger) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.db == nil {
		return nil
	}
	l.bh.halt()
	var err error
	if !l.noPersist {
		err = l.bh.flush(l.db)
	}
	if cerr := l.db.Close(); err == nil {
		err = cerr
	}
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
// holds one.
func (l *Ledger) OrderIDForRequest(requestID string) (string, bool) {
	return l.OrderIDForRequestBytes([]byte(requestID))
}

// OrderIDForRequestBytes is OrderIDForRequest for a request id the caller
// holds as bytes. An id the ledger does not hold costs a hash and a map
// probe under a read lock, no allocation; one it holds is read back from
// its record.
func (l *Ledger) OrderIDForRequestBytes(requestID []byte) (string, bool) {
	l.mu.RLock()
	at, ok := l.requests.candidate(requestID)
	l.mu.RUnlock()
	if !ok {
		return "", false
	}
	v, err := l.read(bucketRequestsByTime, requestTimeKey(at, string(requestID)))
	if err != nil || v == nil {
		return "", false
	}
	return string(v), true
}

// MayHoldRequest reports whether the ledger may hold requestID; false is
// certain. It takes no lock and does not allocate: a buyer with a new
// request id is not slowed down by the ids the ledger holds.
func (l *Ledger) MayHoldRequest(requestID []byte) bool {
	f := l.reqFilter.Load()
	return f == nil || f.MayContain(maphash.Bytes(l.reqSeed, requestID))
}

// MayHaveBought reports whether user may hold or have bought units of a
// per_user sale; false is certain. No lock, no allocation.
func (l *Ledger) MayHaveBought(sku, user []byte) bool {
	f := l.buyerFilter.Load()
	if f == nil {
		return true
	}
	var buf [2*maxKeyBytes + 1]byte
	return f.MayContain(maphash.Bytes(l.reqSeed, appendBuyerKey(buf[:0], sku, user)))
}

// buyerFilterLog2Bits sizes the buyer filter: 512 KiB, half a million
// buyers of per_user sales at its intended rate of false maybes.
const buyerFilterLog2Bits = 22

// read returns a copy of one value, pending changes first, then bbolt;
// nil when absent.
func (l *Ledger) read(bucket, key []byte) ([]byte, error) {
	l.mu.RLock()
	bh := l.bh
	l.mu.RUnlock()
	if bh != nil {
		if v, ok := bh.get(bucket, key); ok {
			return v, nil // pending values are never changed in place
		}
	}
	var out []byte
	err := l.view(func(tx *bolt.Tx) error {
		if v := tx.Bucket(bucket).Get(key); v != nil {
			out = append([]byte(nil), v...)
		}
		return nil
	})
	return out, err
}

// BoughtBytes is the units user holds or bought of a per_user sale, as
// committed. It does not allocate.
func (l *Ledger) BoughtBytes(sku, user []byte) int64 {
	var buf [2*maxKeyBytes + 1]byte
	key := appendBuyerKey(buf[:0], sku, user)
	l.mu.RLock()
	n := l.bought[string(key)]
	l.mu.RUnlock()
	return n
}

// ExpiredHolds returns up to limit held orders whose deadline is at or
// before nowUnixNano, earliest first.
func (l *Ledger) ExpiredHolds(nowUnixNano int64, limit int) []string {
	type hold struct {
		id string
		at int64
	}
	var due []hold
	l.mu.RLock()
	for id, at := range l.holds {
		if at <= nowUnixNano {
			due = append(due, hold{id, at})
		}
	}
	l.mu.RUnlock()
	sort.Slice(due, func(i, j int) bool {
		if due[i].at != due[j].at {
			return due[i].at < due[j].at
		}
		return due[i].id < due[j].id
	})
	ids := make([]string, 0, min(len(due), limit))
	for i := 0; i < len(due) && i < limit; i++ {
		ids = append(ids, due[i].id)
	}
	return ids
}

// HeldOrders is the number of held orders.
func (l *Ledger) HeldOrders() int {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return len(l.holds)
}

// RequestIDs is the number of request ids the ledger remembers.
func (l *Ledger) RequestIDs() int {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.requests.len()
}

// database is the open bbolt file, nil once closed.
func (l *Ledger) database() *bolt.DB {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.db
}

// view runs fn in a bbolt read transaction without holding l.mu, so a long
// read (an audit) never holds up Apply, which takes l.mu to update the
// mirrors. A Restore that swaps the file waits for the transaction to end.
func (l *Ledger) view(fn func(tx *bolt.Tx) error) error {
	l.mu.RLock()
	db := l.db
	l.mu.RUnlock()
	if db == nil {
		return ErrLedgerClosed
	}
	return db.View(fn)
}

// Order reads one order.
func (l *Ledger) Order(id string) (Order, bool, error) {
	var o Order
	l.mu.RLock()
	bh := l.bh
	l.mu.RUnlock()
	if bh != nil {
		if v, ok := bh.get(bucketOrders, []byte(id)); ok {
			if v == nil {
				return Order{}, false, nil
			}
			o, err := decodeOrderRecord(id, v)
			if err != nil {
				return Order{}, false, err
			}
			return o, true, nil
		}
	}
	var found bool
	err := l.view(func(tx *bolt.Tx) error {
		v := tx.Bucket(bucketOrders).Get([]byte(id))
		if v == nil {
			return nil
		}
		found = true
		var err error
		o, err = decodeOrderRecord(id, v)
		return err
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
// It scans every order: audits are rare, and AuditAll does all SKUs in one
// pass.
func (l *Ledger) AuditSKU(sku string) (Audit, bool, error) {
	all, err := l.audit(func(s string) bool { return s == sku })
	if err != nil {
		return Audit{}, true, fmt.Errorf("audit sku %q: %w", sku, err)
	}
	a, ok := all[sku]
	return a, ok, nil
}

// AuditAll audits every SKU in one pass over the orders.
func (l *Ledger) AuditAll() (map[string]Audit, error) {
	return l.audit(func(string) bool { return true })
}

// audit reads rows, orders and the applied index in one bbolt transaction,
// so it sees one consistent state while Apply goes on, and checks the SKUs
// that want accepts.
func (l *Ledger) audit(want func(sku string) bool) (map[string]Audit, error) {
	// The audit reads bbolt alone: write what is pending first.
	if err := l.Flush(); err != nil {
		return nil, err
	}
	audits := map[string]*Audit{}
	err := l.view(func(tx *bolt.Tx) error {
		var applied uint64
		if idx := tx.Bucket(bucketMeta).Get(keyApplied); len(idx) == 8 {
			applied = binary.BigEndian.Uint64(idx)
		}
		err := tx.Bucket(bucketSKUs).ForEach(func(k, v []byte) error {
			if !want(string(k)) {
				return nil
			}
			a := &Audit{AppliedIndex: applied}
			if err := json.Unmarshal(v, &a.Row); err != nil {
				return fmt.Errorf("decode sku %q: %w", k, err)
			}
			audits[string(k)] = a
			return nil
		})
		if err != nil || len(audits) == 0 {
			return err
		}
		return tx.Bucket(bucketOrders).ForEach(func(k, v []byte) error {
			o, err := decodeOrderRecord(string(k), v)
			if err != nil {
				return err
			}
			a, ok := audits[o.SKU]
			if !ok {
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
	if db := l.database(); db != nil {
		dropResidentPages(db)
	}
	if err != nil {
		return nil, err
	}
	out := make(map[string]Audit, len(audits))
	for sku, a := range audits {
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
		out[sku] = *a
	}
	return out, nil
}
