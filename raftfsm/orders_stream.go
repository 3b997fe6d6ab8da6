package raftfsm

import (
	"bytes"
	"encoding/binary"
	"slices"
	"stockd/raftfsm/orderfeed"
	"stockd/raftfsm/store"
	"stockd/stock"

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
		return eachSaleOrder(tx.Bucket(store.BucketOrders), sku, state, after, fn)
	})
	return snap, err
}

// eachSaleOrder is SaleOrders' scan of the orders bucket. The blocks come
// first in the file: the sale's members after after are gathered as
// references, sorted by id and merged with the order records after them.
func eachSaleOrder(bucket *bolt.Bucket, sku string, state stock.OrderState, after string, fn func(*stock.Order) error) error {
	type memberRef struct{ block, off uint32 }
	var blocks []store.OrderBlock
	var refs []memberRef
	var id []byte
	cur := bucket.Cursor()
	k, v := cur.First()
	for ; k != nil && store.IsOrderBlockKey(k); k, v = cur.Next() {
		b, err := store.ParseOrderBlock(k, v)
		if err != nil {
			return err
		}
		blocks = append(blocks, b)
		err = b.Each(func(off int, m *store.BlockMember) bool {
			if recSKU, recState, ok := store.OrderRecordSKU(m.Record); !ok || string(recSKU) != sku || (state != "" && recState != state) {
				return true // a record that does not decode fails when it is read
			}
			if id = b.AppendID(id[:0], m); string(id) > after {
				refs = append(refs, memberRef{uint32(len(blocks) - 1), uint32(off)})
			}
			return true
		})
		if err != nil {
			return err
		}
	}
	member := func(r memberRef) store.BlockMember {
		m, _ := blocks[r.block].Member(int(r.off)) // read once already
		return m
	}
	var other []byte
	slices.SortFunc(refs, func(x, y memberRef) int {
		mx, my := member(x), member(y)
		id = blocks[x.block].AppendID(id[:0], &mx)
		other = blocks[y.block].AppendID(other[:0], &my)
		return bytes.Compare(id, other)
	})
	if after != "" {
		k, v = cur.Seek([]byte(after))
		if k != nil && string(k) == after {
			k, v = cur.Next()
		}
	}
	for i := 0; k != nil || i < len(refs); {
		var o stock.Order
		var err error
		if i < len(refs) {
			m := member(refs[i])
			if id = blocks[refs[i].block].AppendID(id[:0], &m); k == nil || bytes.Compare(id, k) < 0 {
				i++
				if o, err = store.DecodeOrderRecord(string(id), m.Record); err != nil {
					return err
				}
				if err := fn(&o); err != nil {
					return err
				}
				continue
			}
		}
		if o, err = store.DecodeOrderRecord(string(k), v); err != nil {
			return err
		}
		k, v = cur.Next()
		if o.SKU != sku || (state != "" && o.State != state) {
			continue
		}
		if err := fn(&o); err != nil {
			return err
		}
	}
	return nil
}
