package raftfsm

import (
	"fmt"
	"hash/maphash"
	"sort"
	"stockd.dev/stockd/raftfsm/store"
	"stockd.dev/stockd/stock"
	"sync/atomic"

	bolt "go.etcd.io/bbolt"
)

// SKU returns a copy of one sale's row and the applied index it reflects.
func (l *Ledger) SKU(sku string) (stock.SKU, uint64, bool) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	s, ok := l.skus[sku]
	if !ok {
		return stock.SKU{}, l.applied, false
	}
	return *s.Clone(), l.applied, true
}

// SKUAvailability reads what a waiting buyer needs of a sale's row
// without copying it: units available, units leased to any node, and
// whether it was closed.
func (l *Ledger) SKUAvailability(sku string) (available, leased int64, closed, ok bool) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	s, ok := l.skus[sku]
	if !ok {
		return 0, 0, false, false
	}
	return s.Available, s.LeasedTotal(), s.Closed(), true
}

// SKUs returns copies of every sale's row, sorted by SKU, and the applied
// index they reflect.
func (l *Ledger) SKUs() ([]stock.SKU, uint64) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	out := make([]stock.SKU, 0, len(l.skus))
	for _, s := range l.skus {
		out = append(out, *s.Clone())
	}
	sort.Slice(out, func(i, j int) bool { return out[i].SKU < out[j].SKU })
	return out, l.applied
}

// RequestRecord is what the ledger holds for one user's request id: the
// order it produced, or the lottery the user entered with it.
type RequestRecord struct {
	OrderID  string
	EntrySKU string
}

// OrderIDForRequest returns the order user's request id produced, if the
// ledger holds one.
func (l *Ledger) OrderIDForRequest(user, requestID string) (string, bool) {
	rec, ok := l.LookupRequest([]byte(user), []byte(requestID))
	return rec.OrderID, ok && rec.OrderID != ""
}

// LookupRequest finds what user's request id produced: under its scoped
// key, then (while the ledger holds ids of the earlier rules) under the
// bare id, which counts only if its order is this user's, as Apply judges
// (priorRequest). An id the ledger does not hold costs a hash and a
// filter probe, no allocation. Safe for concurrent use.
func (l *Ledger) LookupRequest(user, requestID []byte) (RequestRecord, bool) {
	var buf [maxRequestKeyBytes]byte
	key := appendRequestKey(buf[:0], user, requestID)
	if v, ok := l.lookupRequestKey(key); ok {
		if sku, isEntry := entryOfRequestValue(v); isEntry {
			return RequestRecord{EntrySKU: sku}, true
		}
		return RequestRecord{OrderID: v}, true
	}
	if !l.legacyRequests.Load() {
		return RequestRecord{}, false
	}
	id, ok := l.lookupRequestKey(requestID)
	if !ok {
		return RequestRecord{}, false
	}
	o, found, err := l.Order(id)
	if err != nil || !found || o.User != string(user) {
		return RequestRecord{}, false
	}
	return RequestRecord{OrderID: id}, true
}

// lookupRequestKey returns the value the ledger holds under request key.
func (l *Ledger) lookupRequestKey(key []byte) (string, bool) {
	l.mu.RLock()
	at, ok := l.requests.Candidate(key)
	l.mu.RUnlock()
	if !ok {
		return "", false
	}
	v, ok, err := findRequest(func(k []byte, fn func([]byte) error) error { return l.readIn(store.BucketRequestsByTime, k, fn) }, at, string(key))
	return v, ok && err == nil
}

// MayHoldRequest reports whether the ledger may hold user's request id;
// false is certain. It takes no lock and does not allocate: a buyer with
// a new request id is not slowed down by the ids the ledger holds.
func (l *Ledger) MayHoldRequest(user, requestID []byte) bool {
	f := l.reqFilter.Load()
	if f == nil {
		return true
	}
	var buf [maxRequestKeyBytes]byte
	if f.MayContain(maphash.Bytes(l.reqSeed, appendRequestKey(buf[:0], user, requestID))) {
		return true
	}
	return l.legacyRequests.Load() && f.MayContain(maphash.Bytes(l.reqSeed, requestID))
}

// RequestLine returns a word of the filter line MayHoldRequest reads for
// user and requestID (hashfilter.Filter.Line): reading it brings the line
// in. Without a filter, a word of the ledger's own, which costs nothing
// to read.
func (l *Ledger) RequestLine(user, requestID []byte) *atomic.Uint64 {
	f := l.reqFilter.Load()
	if f == nil {
		return &l.noLine
	}
	var buf [maxRequestKeyBytes]byte
	return f.Line(maphash.Bytes(l.reqSeed, appendRequestKey(buf[:0], user, requestID)))
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
	var out []byte
	err := l.readIn(bucket, key, func(v []byte) error {
		if v != nil {
			out = append([]byte(nil), v...)
		}
		return nil
	})
	return out, err
}

// readIn is read for a caller that needs the value only while fn runs:
// one from the file is not copied.
func (l *Ledger) readIn(bucket, key []byte, fn func(v []byte) error) error {
	l.mu.RLock()
	bh := l.bh
	l.mu.RUnlock()
	if bh != nil {
		if v, ok := bh.Get(bucket, key); ok {
			return fn(v) // pending values are never changed in place
		}
	}
	return l.view(func(tx *bolt.Tx) error { return fn(tx.Bucket(bucket).Get(key)) })
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

// RequestIDs is the number of request ids the ledger remembers.
func (l *Ledger) RequestIDs() int {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.requests.Len()
}

// Order reads one order.
func (l *Ledger) Order(id string) (stock.Order, bool, error) {
	o, ok, err := store.ReadOrder(id, func(key []byte, fn func([]byte) error) error { return l.readIn(store.BucketOrders, key, fn) })
	if err != nil {
		return stock.Order{}, false, fmt.Errorf("read order %q: %w", id, err)
	}
	return o, ok, nil
}
