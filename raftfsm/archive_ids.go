package raftfsm

import (
	"bytes"
	"stockd/raftfsm/store"

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
	next = after
	err = l.view(func(tx *bolt.Tx) error {
		cur := tx.Bucket(store.BucketOrders).Cursor()
		k, v := cur.First()
		if after != nil {
			if k, v = cur.Seek(after); k != nil && bytes.Equal(k, after) {
				k, v = cur.Next()
			}
		}
		scanned := 0
		for ; k != nil; k, v = cur.Next() {
			if len(ids) >= limit || scanned >= scanMax {
				return nil
			}
			found, n, err := appendSaleOrderIDs(sku, k, v, ids)
			if err != nil {
				return err
			}
			if len(found) > limit && len(ids) > 0 {
				return nil // this record waits for the next read; ids holds what came before it
			}
			ids, scanned, next = found, scanned+n, bytes.Clone(k)
		}
		done = true
		return nil
	})
	return ids, next, done, err
}

// appendSaleOrderIDs appends the ids of sku's orders in one record of the
// orders bucket (an order's, or a block's) and counts the orders read.
func appendSaleOrderIDs(sku string, k, v []byte, ids []string) ([]string, int, error) {
	ofSale := func(id string, record []byte) (bool, error) {
		if recSKU, _, ok := store.OrderRecordSKU(record); ok {
			return string(recSKU) == sku, nil
		}
		o, err := store.DecodeOrderRecord(id, record) // an earlier version's record
		return o.SKU == sku, err
	}
	if !store.IsOrderBlockKey(k) {
		mine, err := ofSale(string(k), v)
		if mine {
			ids = append(ids, string(k))
		}
		return ids, 1, err
	}
	b, err := store.ParseOrderBlock(k, v)
	if err != nil {
		return ids, 0, err
	}
	n := 0
	var failed error
	err = b.Each(func(_ int, m *store.BlockMember) bool {
		n++
		id := string(b.AppendID(nil, m))
		mine, err := ofSale(id, m.Record)
		if err != nil {
			failed = err
			return false
		}
		if mine {
			ids = append(ids, id)
		}
		return true
	})
	if failed != nil {
		err = failed
	}
	return ids, n, err
}
