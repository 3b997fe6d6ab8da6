package store

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"stockd.dev/stockd/stock"

	bolt "go.etcd.io/bbolt"
)

// EachSaleOrder calls fn, in order id order, for every order of sku (in
// state, if not empty) in the orders bucket whose id sorts after after. The blocks come
// first in the file: the sale's members after after are gathered as
// references, sorted by id and merged with the order records after them.
func EachSaleOrder(bucket *bolt.Bucket, sku string, state stock.OrderState, after string, fn func(*stock.Order) error) error {
	type memberRef struct{ block, off uint32 }
	var blocks []OrderBlock
	var refs []memberRef
	var id []byte
	cur := bucket.Cursor()
	k, v := cur.First()
	for ; k != nil && IsOrderBlockKey(k); k, v = cur.Next() {
		b, err := ParseOrderBlock(k, v)
		if err != nil {
			return err
		}
		blocks = append(blocks, b)
		err = b.Each(func(off int, m *BlockMember) bool {
			if recSKU, recState, ok := OrderRecordSKU(m.Record); !ok || string(recSKU) != sku || (state != "" && recState != state) {
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
	member := func(r memberRef) BlockMember {
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
				if o, err = DecodeOrderRecord(string(id), m.Record); err != nil {
					return err
				}
				if err := fn(&o); err != nil {
					return err
				}
				continue
			}
		}
		if o, err = DecodeOrderRecord(string(k), v); err != nil {
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

// SaleOrderIDs reads up to limit ids of sku's orders (one block's, if a
// block alone holds more) from the orders bucket after key after (nil:
// from the start), and where the next read starts. It reads at most
// scanMax order records; done says no record is left after those read.
func SaleOrderIDs(tx *bolt.Tx, sku string, after []byte, limit, scanMax int) (ids []string, next []byte, done bool, err error) {
	next = after
	cur := tx.Bucket(BucketOrders).Cursor()
	k, v := cur.First()
	if after != nil {
		if k, v = cur.Seek(after); k != nil && bytes.Equal(k, after) {
			k, v = cur.Next()
		}
	}
	scanned := 0
	for ; k != nil; k, v = cur.Next() {
		if len(ids) >= limit || scanned >= scanMax {
			return ids, next, false, nil
		}
		found, n, err := appendSaleOrderIDs(sku, k, v, ids)
		if err != nil {
			return ids, next, false, err
		}
		if len(found) > limit && len(ids) > 0 {
			return ids, next, false, nil // this record waits for the next read; ids holds what came before it
		}
		ids, scanned, next = found, scanned+n, bytes.Clone(k)
	}
	return ids, next, true, nil
}

// appendSaleOrderIDs appends the ids of sku's orders in one record of the
// orders bucket (an order's, or a block's) and counts the orders read.
func appendSaleOrderIDs(sku string, k, v []byte, ids []string) ([]string, int, error) {
	ofSale := func(id string, record []byte) (bool, error) {
		if recSKU, _, ok := OrderRecordSKU(record); ok {
			return string(recSKU) == sku, nil
		}
		o, err := DecodeOrderRecord(id, record) // an earlier version's record
		return o.SKU == sku, err
	}
	if !IsOrderBlockKey(k) {
		mine, err := ofSale(string(k), v)
		if mine {
			ids = append(ids, string(k))
		}
		return ids, 1, err
	}
	b, err := ParseOrderBlock(k, v)
	if err != nil {
		return ids, 0, err
	}
	n := 0
	var failed error
	err = b.Each(func(_ int, m *BlockMember) bool {
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

// ReadAudits reads the rows of the SKUs that want accepts and counts
// their orders by state, from one transaction: the first half of an audit.
func ReadAudits(tx *bolt.Tx, want func(sku string) bool) (map[string]*stock.Audit, error) {
	audits := map[string]*stock.Audit{}
	applied := AppliedIn(tx)
	err := tx.Bucket(BucketSKUs).ForEach(func(k, v []byte) error {
		if !want(string(k)) {
			return nil
		}
		a := &stock.Audit{AppliedIndex: applied}
		if err := json.Unmarshal(v, &a.Row); err != nil {
			return fmt.Errorf("decode sku %q: %w", k, err)
		}
		audits[string(k)] = a
		return nil
	})
	if err != nil || len(audits) == 0 {
		return audits, err
	}
	err = tx.Bucket(BucketOrders).ForEach(func(k, v []byte) error {
		// Counted in place: the audit reads every order the ledger
		// holds, so it must not allocate per order.
		return TallyStoredOrders(k, v, func(sku []byte, state stock.OrderState, qty int64) {
			a, ok := audits[string(sku)]
			if !ok {
				return
			}
			a.Orders++
			switch state {
			case stock.OrderHeld:
				a.OrdersHeld += qty
			case stock.OrderSold:
				a.OrdersSold += qty
			}
		})
	})
	return audits, err
}
