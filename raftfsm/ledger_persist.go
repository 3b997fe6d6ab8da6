package raftfsm

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/maphash"
	"stockd.dev/stockd/internal/hashfilter"
	"stockd.dev/stockd/raftfsm/requestindex"
	"stockd.dev/stockd/raftfsm/store"
	"stockd.dev/stockd/stock"

	bolt "go.etcd.io/bbolt"
)

// ledgerPersistHealth logs the persister's failures and keeps the
// ledger's PersistHealthy up to date.
type ledgerPersistHealth struct {
	l  *Ledger
	bh *store.WriteBehind // the persister reporting (l.bh changes on a restore)
}

func (h ledgerPersistHealth) Failed(err error, attempt int) {
	h.l.persistFailures.Add(1)
	if !h.l.persistFailing.Swap(true) || attempt%20 == 0 {
		entries, changes := h.bh.Lag()
		h.l.logger.Error("cannot write the ledger; changes wait in memory and in the raft log, retrying",
			"path", h.l.path, "attempt", attempt, "entries_behind", entries, "changes_waiting", changes, "err", err)
	}
}

func (h ledgerPersistHealth) Succeeded() {
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
		bh.SetFault(l.persistFault.Load())
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
	return bh.Flush()
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
	return bh.Lag()
}

func (l *Ledger) loadMirrors(db *bolt.DB) error {
	skus := make(map[string]*stock.SKU)
	requests := requestindex.New(l.reqSeed, isLegacyRequestKey)
	buyers := hashfilter.New(buyerFilterLog2Bits)
	nodes := make(map[string]string)
	holds := make(map[string]int64)
	bought := make(map[string]int64)
	seqHigh := make(map[string]uint64)
	var groupsAtMax uint64
	var applied, rules, restoredFrom, restoredAt uint64
	var clusterID string
	err := db.View(func(tx *bolt.Tx) error {
		applied = store.AppliedIn(tx)
		restoredFrom, restoredAt, clusterID = store.LoadRestored(tx.Bucket(store.BucketMeta))
		var err error
		if rules, err = loadRules(tx.Bucket(store.BucketMeta).Get(keyRules)); err != nil {
			return err
		}
		err = tx.Bucket(store.BucketSKUs).ForEach(func(k, v []byte) error {
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
		err = tx.Bucket(store.BucketNodes).ForEach(func(k, v []byte) error {
			nodes[string(k)] = string(v)
			return nil
		})
		if err != nil {
			return err
		}
		err = tx.Bucket(store.BucketBuyers).ForEach(func(k, v []byte) error {
			if len(v) == 8 {
				bought[string(k)] = int64(binary.BigEndian.Uint64(v))
				buyers.Add(maphash.Bytes(l.reqSeed, k))
			}
			return nil
		})
		if err != nil {
			return err
		}
		err = tx.Bucket(store.BucketOrders).ForEach(func(k, v []byte) error {
			return store.EachStoredOrder(k, v, func(o *stock.Order) error {
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
		if groupsAtMax, err = loadRequests(tx.Bucket(store.BucketRequestsByTime), requests); err != nil {
			return err
		}
		if err := loadOrderSeqs(tx.Bucket(store.BucketMeta), seqHigh); err != nil {
			return err
		}
		return l.feed.Load(tx)
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
	requests.RebuildFilterIfFull() // a ledger holding more ids than the default filter takes
	l.reqFilter.Store(requests.Filter())
	l.legacyRequests.Store(requests.HoldsLegacy())
	l.buyerFilter.Store(buyers)
	return nil
}

// loadRequests adds the request ids of the requests-by-time bucket b to
// requests, and returns the newest record's time (Ledger.requestGroupsAtMax).
func loadRequests(b *bolt.Bucket, requests *requestindex.Index) (atMax uint64, err error) {
	if k, _ := b.Cursor().Last(); len(k) >= 8 {
		atMax = binary.BigEndian.Uint64(k[:8])
	}
	err = b.ForEach(func(k, v []byte) error {
		switch {
		case len(k) > 8: // a record of the earlier format
			requests.Add(string(k[8:]), int64(binary.BigEndian.Uint64(k[:8])))
		case len(k) == 8:
			pairs, err := decodeRequestGroup(v)
			if err != nil {
				return fmt.Errorf("request group %x: %w", k, err)
			}
			for _, p := range pairs {
				requests.Add(p.request, int64(binary.BigEndian.Uint64(k)))
			}
		}
		return nil
	})
	return atMax, err
}

// BeginBackup writes what is pending to the file, then opens a read
// transaction on it: a copy of the ledger at the index its meta bucket
// records. Apply goes on meanwhile; node and version name the writer.
func (l *Ledger) BeginBackup(node, version string) (*store.Backup, error) {
	if err := l.Flush(); err != nil {
		return nil, fmt.Errorf("persist before backup: %w", err)
	}
	tx, err := l.beginRead()
	if err != nil {
		return nil, fmt.Errorf("begin backup: %w", err)
	}
	return store.NewBackup(tx, node, version), nil
}

// ClusterID is the identity of the cluster this ledger belongs to: set by
// a restore, "" for a cluster never restored. Nodes carry it on every
// connection to each other; a node with one refuses a peer without it.
func (l *Ledger) ClusterID() string {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.clusterID
}

// checkRestoreGap refuses a cursor that names an index the old cluster
// may have written after the backup this ledger was restored from: its
// events are not in this cluster, and reading on would skip them.
func (l *Ledger) checkRestoreGap(c stock.Cursor) error {
	l.mu.RLock()
	from, at := l.restoredFrom, l.restoredAt
	l.mu.RUnlock()
	if c.Index > from && c.Index <= at {
		return fmt.Errorf("%w: %s is from the cluster this one was restored from, after its backup at index %d; this cluster's feed goes on from index %d", stock.ErrCursorExpired, c, from, at)
	}
	return nil
}
