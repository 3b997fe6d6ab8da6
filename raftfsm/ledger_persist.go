package raftfsm

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/maphash"
	"stockd/internal/hashfilter"
	"stockd/stock"

	bolt "go.etcd.io/bbolt"
)

// ledgerPersistHealth logs the persister's failures and keeps the
// ledger's PersistHealthy up to date.
type ledgerPersistHealth struct {
	l  *Ledger
	bh *behind // the persister reporting (l.bh changes on a restore)
}

func (h ledgerPersistHealth) failed(err error, attempt int) {
	h.l.persistFailures.Add(1)
	if !h.l.persistFailing.Swap(true) || attempt%20 == 0 {
		entries, changes := h.bh.lag()
		h.l.logger.Error("cannot write the ledger; changes wait in memory and in the raft log, retrying",
			"path", h.l.path, "attempt", attempt, "entries_behind", entries, "changes_waiting", changes, "err", err)
	}
}

func (h ledgerPersistHealth) succeeded() {
	if h.l.persistFailing.Swap(false) {
		h.l.logger.Info("ledger writes again", "path", h.l.path)
	}
}

// PersistHealthy reports whether the last write of ledger.db succeeded.
// While it fails, applied changes wait in memory (and in the raft log) up
// to a bound; the node should not take new sales meanwhile.
func (l *Ledger) PersistHealthy() bool { return !l.persistFailing.Load() }

// Restores counts the snapshots this ledger was restored from since start
// (raft installs one on a node too far behind the leader's log).
func (l *Ledger) Restores() uint64 { return l.restores.Load() }

// PersistFailures counts failed writes of ledger.db since start.
func (l *Ledger) PersistFailures() uint64 { return l.persistFailures.Load() }

// SetPersistFault makes every write of ledger.db first call fault and
// fail with its error, if any; nil removes it. For tests of a full or
// failing disk.
func (l *Ledger) SetPersistFault(fault func() error) {
	if fault == nil {
		l.persistFault.Store(nil)
	} else {
		l.persistFault.Store(&fault)
	}
	l.mu.RLock()
	bh := l.bh
	l.mu.RUnlock()
	if bh != nil {
		bh.fault.Store(l.persistFault.Load())
	}
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
	return bh.flush()
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
	skus := make(map[string]*stock.SKU)
	requests := newRequestIndex(l.reqSeed)
	buyers := hashfilter.New(buyerFilterLog2Bits)
	nodes := make(map[string]string)
	holds := make(map[string]int64)
	bought := make(map[string]int64)
	seqHigh := make(map[string]uint64)
	var groupsAtMax uint64
	var applied, rules, restoredFrom, restoredAt uint64
	var clusterID string
	err := db.View(func(tx *bolt.Tx) error {
		applied = appliedIn(tx)
		restoredFrom, restoredAt, clusterID = loadRestored(tx.Bucket(bucketMeta))
		var err error
		if rules, err = loadRules(tx.Bucket(bucketMeta).Get(keyRules)); err != nil {
			return err
		}
		err = tx.Bucket(bucketSKUs).ForEach(func(k, v []byte) error {
			var s stock.SKU
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
			return eachStoredOrder(k, v, func(o *stock.Order) error {
				if o.State == stock.OrderHeld {
					holds[o.ID] = o.ExpiresAtUnixNano
				}
				raiseOrderSeq(seqHigh, o.ID)
				return nil
			})
		})
		if err != nil {
			return err
		}
		if groupsAtMax, err = loadRequests(tx.Bucket(bucketRequestsByTime), requests); err != nil {
			return err
		}
		if err := loadOrderSeqs(tx.Bucket(bucketMeta), seqHigh); err != nil {
			return err
		}
		return l.feed.load(tx)
	})
	if err != nil {
		return err
	}
	l.applied, l.rules, l.skus, l.requests, l.nodes, l.holds, l.bought = applied, rules, skus, requests, nodes, holds, bought
	l.requestGroupsAtMax = groupsAtMax
	l.restoredFrom, l.restoredAt, l.clusterID = restoredFrom, restoredAt, clusterID
	l.orderSeqs = make(map[string]*seqWindow, len(seqHigh))
	for owner, high := range seqHigh {
		l.orderSeqs[owner] = &seqWindow{floor: high, high: high}
	}
	requests.rebuildFilterIfFull() // a ledger holding more ids than the default filter takes
	l.reqFilter.Store(requests.filter)
	l.legacyRequests.Store(requests.legacy > 0)
	l.buyerFilter.Store(buyers)
	return nil
}

// loadRequests adds the request ids of the requests-by-time bucket b to
// requests, and returns the newest record's time (Ledger.requestGroupsAtMax).
func loadRequests(b *bolt.Bucket, requests *requestIndex) (atMax uint64, err error) {
	if k, _ := b.Cursor().Last(); len(k) >= 8 {
		atMax = binary.BigEndian.Uint64(k[:8])
	}
	err = b.ForEach(func(k, v []byte) error {
		switch {
		case len(k) > 8: // a record of the earlier format
			requests.add(string(k[8:]), int64(binary.BigEndian.Uint64(k[:8])))
		case len(k) == 8:
			pairs, err := decodeRequestGroup(v)
			if err != nil {
				return fmt.Errorf("request group %x: %w", k, err)
			}
			for _, p := range pairs {
				requests.add(p.request, int64(binary.BigEndian.Uint64(k)))
			}
		}
		return nil
	})
	return atMax, err
}
