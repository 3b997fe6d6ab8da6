package raftfsm

import (
	"stockd.dev/stockd/raftfsm/store"

	bolt "go.etcd.io/bbolt"
)

// ArchivedOrderIDs is the leader's side of a PurgeOrders step: up to
// limit ids of sku's orders (one block's, if a block alone holds more),
// read from this node's file after its key after (nil: from the start),
// and where the next read starts. It reads at most scanMax order records;
// done says the file has no record left after those read. The keys are
// this file's own, good only for this node's next read: what a step
// removes travels as ids.
func (l *Ledger) ArchivedOrderIDs(sku string, after []byte, limit, scanMax int) (ids []string, next []byte, done bool, err error) {
	// The first read writes what the ledger applied to the file, so that
	// it sees every order of the sale (none is added once it is closed).
	// Later reads may find the file behind the purge's steps: they then
	// name orders gone already, which a step passes over.
	if after == nil {
		if err := l.Flush(); err != nil {
			return nil, nil, false, err
		}
	}
	err = l.view(func(tx *bolt.Tx) error {
		ids, next, done, err = store.SaleOrderIDs(tx, sku, after, limit, scanMax)
		return err
	})
	return ids, next, done, err
}
