package store

import (
	"bytes"
	"fmt"
	"stockd.dev/stockd/internal/wire"
	"stockd.dev/stockd/raftfsm/orderid"
	"stockd.dev/stockd/stock"
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
	OrderBlockFormat    byte = 0xB1
	OrderBlockBits           = 8
	OrderBlockKeyPrefix      = "\x00"
)

// OrderBlockPlace says where order id belongs when it is stored in a
// block: the block's key, the member's slot in it and the id's random
// part. ok is false for an id not of the engine's canonical shape.
func OrderBlockPlace(id string) (key string, slot byte, random string, ok bool) {
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
	return OrderBlockKey(p.Node, p.Seq>>OrderBlockBits), byte(p.Seq), p.Random, true
}

func OrderBlockKey(owner string, block uint64) string {
	return string(AppendOrderBlockKey(make([]byte, 0, len(owner)+16), owner, block))
}

// AppendOrderBlockKey appends the key of owner's block to b.
func AppendOrderBlockKey(b []byte, owner string, block uint64) []byte {
	b = append(b, OrderBlockKeyPrefix...)
	b = append(b, owner...)
	b = append(b, 0)
	return strconv.AppendUint(b, block, 36)
}

func IsOrderBlockKey(k []byte) bool { return len(k) > 0 && k[0] == OrderBlockKeyPrefix[0] }

// OrderBlock is a block's record, decoded as far as its key.
type OrderBlock struct {
	owner string
	block uint64
	v     []byte
}

func ParseOrderBlock(k, v []byte) (OrderBlock, error) {
	sep := bytes.LastIndexByte(k, 0)
	if !IsOrderBlockKey(k) || sep < 2 {
		return OrderBlock{}, fmt.Errorf("%w: order block key %q", wire.ErrMalformed, k)
	}
	block, err := strconv.ParseUint(string(k[sep+1:]), 36, 64)
	if err != nil {
		return OrderBlock{}, fmt.Errorf("%w: order block key %q", wire.ErrMalformed, k)
	}
	if len(v) == 0 || v[0] != OrderBlockFormat {
		return OrderBlock{}, fmt.Errorf("%w: order block %q: not a block", wire.ErrMalformed, k)
	}
	return OrderBlock{owner: string(k[1:sep]), block: block, v: v}, nil
}

// BlockMember is one order of a block: its slot, its id's random part
// and its record, as views into the block's value.
type BlockMember struct {
	slot   byte
	random []byte
	Record []byte
	Next   int // the offset of the member after it
}

// Member reads the Member at offset off of the block's value (the first
// is at 1).
func (b *OrderBlock) Member(off int) (BlockMember, error) {
	d := wire.Decoder{B: b.v[off:]}
	m := BlockMember{slot: d.Byte(), random: d.Bytes(), Record: d.Bytes()}
	if d.Err != nil {
		return BlockMember{}, fmt.Errorf("order block of %q %d at %d: %w", b.owner, b.block, off, d.Err)
	}
	m.Next = len(b.v) - len(d.B)
	return m, nil
}

// AppendID appends member m's order id.
func (b *OrderBlock) AppendID(dst []byte, m *BlockMember) []byte {
	dst = append(dst, b.owner...)
	dst = append(dst, '-')
	dst = strconv.AppendUint(dst, b.block<<OrderBlockBits|uint64(m.slot), 36)
	dst = append(dst, '-')
	return append(dst, m.random...)
}

func (b *OrderBlock) Order(m *BlockMember) (stock.Order, error) {
	return DecodeOrderRecord(string(b.AppendID(nil, m)), m.Record)
}

// Each calls fn for every member, in the order they were added, until fn
// returns false.
// fn must not keep m past its call: one member value serves the whole
// walk (passed by pointer to a func value, it lives on the heap: one
// allocation a walk, not one a member).
func (b *OrderBlock) Each(fn func(off int, m *BlockMember) bool) error {
	var m BlockMember
	for off := 1; off < len(b.v); {
		var err error
		if m, err = b.Member(off); err != nil {
			return err
		}
		if !fn(off, &m) {
			return nil
		}
		off = m.Next
	}
	return nil
}

// find returns the record of the member with slot and random, or nil.
func (b *OrderBlock) find(slot byte, random string) ([]byte, error) {
	var rec []byte
	err := b.Each(func(_ int, m *BlockMember) bool {
		if m.slot == slot && string(m.random) == random {
			rec = m.Record
			return false
		}
		return true
	})
	return rec, err
}

// AppendBlockMember appends order o as a member of its block; scratch is
// memory for its record, returned for the next call.
func AppendBlockMember(dst, scratch []byte, slot byte, random string, o *stock.Order) ([]byte, []byte) {
	dst = append(dst, slot)
	dst = wire.AppendString(dst, random)
	scratch = EncodeOrderRecord(scratch[:0], o)
	dst = wire.AppendUvarint(dst, uint64(len(scratch)))
	return append(dst, scratch...), scratch
}

// EachStoredOrder calls fn for the order, or each order of the block,
// that record k, v of the orders bucket holds.
func EachStoredOrder(k, v []byte, fn func(*stock.Order) error) error {
	if !IsOrderBlockKey(k) {
		o, err := DecodeOrderRecord(string(k), v)
		if err != nil {
			return err
		}
		return fn(&o)
	}
	b, err := ParseOrderBlock(k, v)
	if err != nil {
		return err
	}
	var fnErr error
	err = b.Each(func(_ int, m *BlockMember) bool {
		var o stock.Order
		if o, fnErr = b.Order(m); fnErr == nil {
			fnErr = fn(&o)
		}
		return fnErr == nil
	})
	if err != nil {
		return err
	}
	return fnErr
}

// TallyStoredOrders calls fn with the sale, state and units of the
// order, or each order of the block, that record k, v of the orders
// bucket holds, reading them in place (sku is valid during the call). A
// record it cannot read so is decoded in full, and an error of that is
// returned.
func TallyStoredOrders(k, v []byte, fn func(sku []byte, state stock.OrderState, qty int64)) error {
	if !IsOrderBlockKey(k) {
		if sku, state, qty, ok := orderRecordTally(v); ok {
			fn(sku, state, qty)
			return nil
		}
		o, err := DecodeOrderRecord(string(k), v)
		if err != nil {
			return err
		}
		fn([]byte(o.SKU), o.State, o.Qty)
		return nil
	}
	b, err := ParseOrderBlock(k, v)
	if err != nil {
		return err
	}
	var orderErr error
	err = b.Each(func(_ int, m *BlockMember) bool {
		if sku, state, qty, ok := orderRecordTally(m.Record); ok {
			fn(sku, state, qty)
			return true
		}
		var o stock.Order
		if o, orderErr = b.Order(m); orderErr != nil {
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

// ReadOrder finds order id through get, which calls fn with the value of
// a key of the orders bucket (nil: absent), valid during the call: its
// own record first, then its place in a block.
func ReadOrder(id string, get func(key []byte, fn func(v []byte) error) error) (stock.Order, bool, error) {
	var o stock.Order
	found := false
	err := get([]byte(id), func(v []byte) error {
		if v == nil {
			return nil
		}
		found = true
		var err error
		o, err = DecodeOrderRecord(id, v)
		return err
	})
	key, slot, random, shaped := OrderBlockPlace(id)
	if found || err != nil || !shaped {
		return o, found && err == nil, err
	}
	err = get([]byte(key), func(v []byte) error {
		if v == nil {
			return nil
		}
		b, err := ParseOrderBlock([]byte(key), v)
		if err != nil {
			return err
		}
		rec, err := b.find(slot, random)
		if err != nil || rec == nil {
			return err
		}
		found = true
		o, err = DecodeOrderRecord(id, rec)
		return err
	})
	return o, found && err == nil, err
}
