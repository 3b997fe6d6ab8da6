package raftfsm

import (
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
	err := l.view(func(tx *bolt.Tx) (err error) {
		snap.Applied = store.AppliedIn(tx)
		if snap.FeedCursor, err = orderfeed.NewestCursorIn(tx); err != nil {
			return err
		}
		return store.EachSaleOrder(tx.Bucket(store.BucketOrders), sku, state, after, fn)
	})
	return snap, err
}
