package raftfsm

import (
	"encoding/binary"
	"stockd.dev/stockd/raftfsm/orderfeed"
	"stockd.dev/stockd/raftfsm/store"
	"stockd.dev/stockd/stock"

	bolt "go.etcd.io/bbolt"
)

// SaleOrders calls fn, in order id order, for every order of sku (in
// state, if not empty) whose id sorts after after, from one consistent
// state of the ledger file; fn returning an error stops the scan. It
// writes pending changes first, and scans every order of the ledger (the
// file has no per-sale index): a reconciliation read, not a hot path.
func (l *Ledger) SaleOrders(sku string, state stock.OrderState, after string, fn func(*stock.Order) error) (stock.OrdersSnapshot, error) {
	if err := l.Flush(); err != nil {
		return stock.OrdersSnapshot{}, err
	}
	var snap stock.OrdersSnapshot
	err := l.view(func(tx *bolt.Tx) error {
		meta := tx.Bucket(store.BucketMeta)
		snap.Applied = store.AppliedIn(tx)
		if v := meta.Get(store.KeyFeedSeq); len(v) == 8 {
			seq := binary.BigEndian.Uint64(v)
			if e, ok, err := orderfeed.ReadFeedEvent(tx.Bucket(store.BucketEvents), seq); err != nil {
				return err
			} else if ok {
				snap.FeedCursor = e.Cursor()
			} else if fv := meta.Get(store.KeyFeedFloor); fv != nil {
				if c, err := orderfeed.DecodeCursor(fv); err == nil && c.Seq == seq {
					snap.FeedCursor = c // the newest event was pruned
				}
			}
		}
		return store.EachSaleOrder(tx.Bucket(store.BucketOrders), sku, state, after, fn)
	})
	return snap, err
}
