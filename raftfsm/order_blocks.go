package raftfsm

import (
	"bytes"
	"fmt"
	"stockd/internal/wire"
	"stockd/raftfsm/orderid"
	"stockd/stock"
	"strconv"
)

// Orders in blocks (file format 3). An order a take creates sold, with an
// id of the engine's shape ("<node>-<sequence>-<random>", the sequence in
// canonical base 36), never changes until its sale is archived. Such
// orders share a record per block: the orders of sequences k*256 to
// k*256+255 of one node. One record instead of 256 is what makes a sale's
// orders cheap to write. Any other order (held, a lottery's, an id of
// another shape, or one a version before format 3 wrote) keeps a record
// of its own, keyed by its id.
//
// A block's key is 0x00, the node, 0x00 and the block number in base 36.
// Order ids never hold a 0x00 byte, so blocks sort before every order
// record and no id can be taken for a block. The key is text (valid
// UTF-8): an archive's purge keeps it as its cursor in the sale's JSON
// row. The value is
// orderBlockFormat, then each member: its sequence's low byte, its id's
// random part (a string) and its order record (bytes, as
// encodeOrderRecord writes it).

const (
	orderBlockFormat    byte = 0xB1
	orderBlockBits           = 8
	orderBlockKeyPrefix      = "\x00"
)

// orderBlockPlace says where order id belongs when it is stored in a
// block: the block's key, the member's slot in it and the id's random
// part. ok is false for an id not of the engine's canonical shape.
func orderBlockPlace(id string) (key string, slot byte, random string, ok bool) {
	p, ok := orderid.Parse(id)
	if !ok {
		return "", 0, "", false
	}
	return blockPlace(&p)
}

// blockPlace is orderBlockPlace for an id already parsed.
func blockPlace(p *orderid.ID) (key string, slot byte, random string, ok bool) {
	if !p.CanonicalSeq() {
		return "", 0, "", false // not canonical: "0a", "A"; its id could not be rebuilt
	}
	return orderBlockKey(p.Node, p.Seq>>orderBlockBits), byte(p.Seq), p.Random, true
}

func orderBlockKey(owner string, block uint64) string {
	return string(appendOrderBlockKey(make([]byte, 0, len(owner)+16), owner, block))
}

// appendOrderBlockKey appends the key of owner's block to b.
func appendOrderBlockKey(b []byte, owner string, block uint64) []byte {
	b = append(b, orderBlockKeyPrefix...)
	b = append(b, owner...)
	b = append(b, 0)
	return strconv.AppendUint(b, block, 36)
}

func isOrderBlockKey(k []byte) bool { return len(k) > 0 && k[0] == orderBlockKeyPrefix[0] }

// orderBlock is a block's record, decoded as far as its key.
type orderBlock struct {
	owner string
	block uint64
	v     []byte
}

func parseOrderBlock(k, v []byte) (orderBlock, error) {
	sep := bytes.LastIndexByte(k, 0)
	if !isOrderBlockKey(k) || sep < 2 {
		return orderBlock{}, fmt.Errorf("%w: order block key %q", ErrMalformed, k)
	}
	block, err := strconv.ParseUint(string(k[sep+1:]), 36, 64)
	if err != nil {
		return orderBlock{}, fmt.Errorf("%w: order block key %q", ErrMalformed, k)
	}
	if len(v) == 0 || v[0] != orderBlockFormat {
		return orderBlock{}, fmt.Errorf("%w: order block %q: not a block", ErrMalformed, k)
	}
	return orderBlock{owner: string(k[1:sep]), block: block, v: v}, nil
}

// blockMember is one order of a block: its slot, its id's random part
// and its record, as views into the block's value.
type blockMember struct {
	slot   byte
	random []byte
	record []byte
	next   int // the offset of the member after it
}

// member reads the member at offset off of the block's value (the first
// is at 1).
func (b *orderBlock) member(off int) (blockMember, error) {
	d := wire.Decoder{B: b.v[off:]}
	m := blockMember{slot: d.Byte(), random: d.Bytes(), record: d.Bytes()}
	if d.Err != nil {
		return blockMember{}, fmt.Errorf("order block of %q %d at %d: %w", b.owner, b.block, off, d.Err)
	}
	m.next = len(b.v) - len(d.B)
	return m, nil
}

// appendID appends member m's order id.
func (b *orderBlock) appendID(dst []byte, m *blockMember) []byte {
	dst = append(dst, b.owner...)
	dst = append(dst, '-')
	dst = strconv.AppendUint(dst, b.block<<orderBlockBits|uint64(m.slot), 36)
	dst = append(dst, '-')
	return append(dst, m.random...)
}

func (b *orderBlock) order(m *blockMember) (stock.Order, error) {
	return decodeOrderRecord(string(b.appendID(nil, m)), m.record)
}

// each calls fn for every member, in the order they were added, until fn
// returns false.
// fn must not keep m past its call: one member value serves the whole
// walk (passed by pointer to a func value, it lives on the heap: one
// allocation a walk, not one a member).
func (b *orderBlock) each(fn func(off int, m *blockMember) bool) error {
	var m blockMember
	for off := 1; off < len(b.v); {
		var err error
		if m, err = b.member(off); err != nil {
			return err
		}
		if !fn(off, &m) {
			return nil
		}
		off = m.next
	}
	return nil
}

// find returns the record of the member with slot and random, or nil.
func (b *orderBlock) find(slot byte, random string) ([]byte, error) {
	var rec []byte
	err := b.each(func(_ int, m *blockMember) bool {
		if m.slot == slot && string(m.random) == random {
			rec = m.record
			return false
		}
		return true
	})
	return rec, err
}

// appendBlockMember appends order o as a member of its block; scratch is
// memory for its record, returned for the next call.
func appendBlockMember(dst, scratch []byte, slot byte, random string, o *stock.Order) ([]byte, []byte) {
	dst = append(dst, slot)
	dst = wire.AppendString(dst, random)
	scratch = encodeOrderRecord(scratch[:0], o)
	dst = wire.AppendUvarint(dst, uint64(len(scratch)))
	return append(dst, scratch...), scratch
}

// eachStoredOrder calls fn for the order, or each order of the block,
// that record k, v of the orders bucket holds.
func eachStoredOrder(k, v []byte, fn func(*stock.Order) error) error {
	if !isOrderBlockKey(k) {
		o, err := decodeOrderRecord(string(k), v)
		if err != nil {
			return err
		}
		return fn(&o)
	}
	b, err := parseOrderBlock(k, v)
	if err != nil {
		return err
	}
	var fnErr error
	err = b.each(func(_ int, m *blockMember) bool {
		var o stock.Order
		if o, fnErr = b.order(m); fnErr == nil {
			fnErr = fn(&o)
		}
		return fnErr == nil
	})
	if err != nil {
		return err
	}
	return fnErr
}

// tallyStoredOrders calls fn with the sale, state and units of the
// order, or each order of the block, that record k, v of the orders
// bucket holds, reading them in place (sku is valid during the call). A
// record it cannot read so is decoded in full, and an error of that is
// returned.
func tallyStoredOrders(k, v []byte, fn func(sku []byte, state stock.OrderState, qty int64)) error {
	if !isOrderBlockKey(k) {
		if sku, state, qty, ok := orderRecordTally(v); ok {
			fn(sku, state, qty)
			return nil
		}
		o, err := decodeOrderRecord(string(k), v)
		if err != nil {
			return err
		}
		fn([]byte(o.SKU), o.State, o.Qty)
		return nil
	}
	b, err := parseOrderBlock(k, v)
	if err != nil {
		return err
	}
	var orderErr error
	err = b.each(func(_ int, m *blockMember) bool {
		if sku, state, qty, ok := orderRecordTally(m.record); ok {
			fn(sku, state, qty)
			return true
		}
		var o stock.Order
		if o, orderErr = b.order(m); orderErr != nil {
			return false
		}
		fn([]byte(o.SKU), o.State, o.Qty)
		return true
	})
	if err != nil {
		return err
	}
	return orderErr
}

// readOrder finds order id through get, which calls fn with the value of
// a key of the orders bucket (nil: absent), valid during the call: its
// own record first, then its place in a block.
func readOrder(id string, get func(key []byte, fn func(v []byte) error) error) (stock.Order, bool, error) {
	var o stock.Order
	found := false
	err := get([]byte(id), func(v []byte) error {
		if v == nil {
			return nil
		}
		found = true
		var err error
		o, err = decodeOrderRecord(id, v)
		return err
	})
	key, slot, random, shaped := orderBlockPlace(id)
	if found || err != nil || !shaped {
		return o, found && err == nil, err
	}
	err = get([]byte(key), func(v []byte) error {
		if v == nil {
			return nil
		}
		b, err := parseOrderBlock([]byte(key), v)
		if err != nil {
			return err
		}
		rec, err := b.find(slot, random)
		if err != nil || rec == nil {
			return err
		}
		found = true
		o, err = decodeOrderRecord(id, rec)
		return err
	})
	return o, found && err == nil, err
}
