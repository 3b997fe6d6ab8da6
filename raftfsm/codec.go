package raftfsm

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
)

// ErrMalformed marks bytes that are not a valid command or result: a
// sender that gets it back must not send the same bytes again.
var ErrMalformed = errors.New("malformed encoding")

// maxVarintBytes is the longest varint encoding of a 64-bit value.
const maxVarintBytes = binary.MaxVarintLen64

// maxStringBytes bounds one decoded string: ids are at most a few hundred
// bytes; a longer length is a corrupt or hostile entry.
const maxStringBytes = 1 << 16

func appendUvarint(b []byte, v uint64) []byte { return binary.AppendUvarint(b, v) }
func appendVarint(b []byte, v int64) []byte   { return binary.AppendVarint(b, v) }

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

func uvarintLen(n int) int {
	l := 1
	for n >= 0x80 {
		n >>= 7
		l++
	}
	return l
}

// decoder reads the fields appended above. The first error sticks; later
// reads return zero values, and finish reports it (or trailing bytes).
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail(what string) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: bad %s", ErrMalformed, what)
	}
	d.b = nil
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail("unsigned varint")
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) varint() int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.fail("varint")
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) string() string {
	n := d.uvarint()
	if d.err != nil {
		return ""
	}
	if n > maxStringBytes || n > uint64(len(d.b)) {
		d.fail("string length")
		return ""
	}
	s := string(d.b[:n])
	d.b = d.b[n:]
	return s
}

// bytes is string without a copy: the bytes stay those of the input.
func (d *decoder) bytes() []byte {
	n := d.uvarint()
	if d.err != nil {
		return nil
	}
	if n > maxStringBytes || n > uint64(len(d.b)) {
		d.fail("string length")
		return nil
	}
	s := d.b[:n:n]
	d.b = d.b[n:]
	return s
}

// count reads an element count, refusing one that the remaining bytes
// cannot hold at minBytes each (so a forged count cannot make the decoder
// allocate much).
func (d *decoder) count(minBytes int) int {
	n := d.uvarint()
	if d.err != nil {
		return 0
	}
	if n > uint64(len(d.b)/minBytes) {
		d.fail("element count")
		return 0
	}
	return int(n)
}

func (d *decoder) byte() byte {
	if d.err != nil {
		return 0
	}
	if len(d.b) == 0 {
		d.fail("byte")
		return 0
	}
	v := d.b[0]
	d.b = d.b[1:]
	return v
}

func (d *decoder) finish() error {
	if d.err == nil && len(d.b) > 0 {
		d.err = fmt.Errorf("%w: %d trailing bytes", ErrMalformed, len(d.b))
	}
	return d.err
}

// resultFormat is the first byte of an encoded Result.
const resultFormat byte = 0xD1

// Result flags say which optional parts follow.
const (
	resultHasOrder byte = 1 << iota
	resultHasTakes
	resultHasEntries
)

// EncodeResult appends r to dst: the answer a leader sends back to a
// follower that forwarded a command.
func EncodeResult(dst []byte, r *Result) []byte {
	var flags byte
	if r.Order != nil {
		flags |= resultHasOrder
	}
	if r.Takes != nil {
		flags |= resultHasTakes
	}
	if r.Entries != nil {
		flags |= resultHasEntries
	}
	dst = append(dst, resultFormat, byte(r.Outcome), flags)
	dst = appendVarint(dst, r.Qty)
	dst = appendUvarint(dst, r.Index)
	dst = appendString(dst, r.Detail)
	if r.Order != nil {
		dst = appendOrder(dst, r.Order)
	}
	if r.Takes != nil {
		dst = appendUvarint(dst, uint64(len(r.Takes)))
		for i := range r.Takes {
			dst = append(dst, byte(r.Takes[i].Outcome))
			dst = appendOrder(dst, &r.Takes[i].Order)
		}
	}
	if r.Entries != nil {
		dst = appendUvarint(dst, uint64(len(r.Entries)))
		for i := range r.Entries {
			e := &r.Entries[i]
			dst = append(dst, byte(e.Outcome))
			dst = appendString(appendString(appendString(dst, e.Entry.SKU), e.Entry.User), e.Entry.RequestID)
			dst = appendVarint(appendVarint(dst, e.Entry.Seq), e.Entry.AtUnixNano)
		}
	}
	return dst
}

// DecodeResult parses bytes written by EncodeResult.
func DecodeResult(b []byte) (*Result, error) {
	if len(b) < 3 || b[0] != resultFormat {
		return nil, fmt.Errorf("%w: not a result", ErrMalformed)
	}
	r := &Result{Outcome: Outcome(b[1])}
	flags := b[2]
	d := decoder{b: b[3:]}
	r.Qty = d.varint()
	r.Index = d.uvarint()
	r.Detail = d.string()
	if flags&resultHasOrder != 0 {
		o := decodeOrder(&d)
		r.Order = &o
	}
	if flags&resultHasTakes != 0 {
		r.Takes = make([]TakeResult, d.count(minOrderBytes+1))
		for i := range r.Takes {
			r.Takes[i].Outcome = Outcome(d.byte())
			r.Takes[i].Order = decodeOrder(&d)
		}
	}
	if flags&resultHasEntries != 0 {
		r.Entries = make([]EntryResult, d.count(6))
		for i := range r.Entries {
			e := &r.Entries[i]
			e.Outcome = Outcome(d.byte())
			e.Entry.SKU, e.Entry.User, e.Entry.RequestID = d.string(), d.string(), d.string()
			e.Entry.Seq, e.Entry.AtUnixNano = d.varint(), d.varint()
		}
	}
	if err := d.finish(); err != nil {
		return nil, fmt.Errorf("result: %w", err)
	}
	return r, nil
}

// minOrderBytes is the smallest encoded order (empty strings, one-byte
// numbers).
const minOrderBytes = 10

func appendOrder(b []byte, o *Order) []byte {
	b = appendString(b, o.ID)
	b = appendString(b, o.SKU)
	b = appendString(b, o.User)
	b = appendVarint(b, o.Qty)
	b = appendString(b, string(o.State))
	b = appendString(b, o.RequestID)
	b = appendString(b, o.Node)
	b = appendVarint(b, o.CreatedAtUnixNano)
	b = appendVarint(b, o.ExpiresAtUnixNano)
	return appendString(b, o.ReleaseReason)
}

func decodeOrder(d *decoder) Order {
	return Order{
		ID: d.string(), SKU: d.string(), User: d.string(), Qty: d.varint(),
		State: OrderState(d.string()), RequestID: d.string(), Node: d.string(),
		CreatedAtUnixNano: d.varint(), ExpiresAtUnixNano: d.varint(), ReleaseReason: d.string(),
	}
}

// legacyCommand is the JSON log entry of versions before the binary
// format: one struct for every op. Raft logs written by them are still
// replayed.
type legacyCommand struct {
	Op             Op          `json:"op"`
	AtUnixNano     int64       `json:"at"`
	Node           string      `json:"node"`
	SKU            string      `json:"sku"`
	Qty            int64       `json:"qty"`
	Sale           *SaleConfig `json:"sale"`
	Takes          []TakeEntry `json:"takes"`
	OrderID        string      `json:"order"`
	Reason         string      `json:"reason"`
	Addr           string      `json:"addr"`
	OrderIDs       []string    `json:"orders"`
	BeforeUnixNano int64       `json:"before"`
	MaxKeep        int64       `json:"max_keep"`
}

func decodeLegacyCommand(b []byte) (int64, Command, error) {
	var l legacyCommand
	if err := json.Unmarshal(b, &l); err != nil {
		return 0, nil, fmt.Errorf("%w: json command: %v", ErrMalformed, err)
	}
	c, err := l.typed()
	return l.AtUnixNano, c, err
}

// typed returns the typed command the legacy entry stands for.
func (l *legacyCommand) typed() (Command, error) {
	var c Command
	switch l.Op {
	case OpCreateSale:
		cs := &CreateSale{SKU: l.SKU}
		if l.Sale != nil {
			cs.Sale = *l.Sale
		} else {
			cs.Sale.Total = -1 // refused by Apply as before
		}
		c = cs
	case OpRestock:
		c = &Restock{SKU: l.SKU, Qty: l.Qty}
	case OpLease:
		c = &Lease{Node: l.Node, SKU: l.SKU, Want: l.Qty}
	case OpReturn:
		c = &Return{Node: l.Node, SKU: l.SKU, Qty: l.Qty}
	case OpTake:
		c = &Take{Node: l.Node, Entries: l.Takes}
	case OpConfirm:
		c = &Confirm{OrderID: l.OrderID}
	case OpRelease:
		c = &Release{OrderID: l.OrderID, Reason: l.Reason}
	case OpReclaim:
		c = &Reclaim{Node: l.Node}
	case OpRegister:
		c = &Register{Node: l.Node, Addr: l.Addr}
	case OpExpire:
		c = &Expire{OrderIDs: l.OrderIDs}
	case OpPruneRequests:
		c = &PruneRequests{BeforeUnixNano: l.BeforeUnixNano, MaxKeep: l.MaxKeep}
	default:
		return nil, fmt.Errorf("%w: unknown op %d", ErrMalformed, l.Op)
	}
	return c, nil
}

// orderRecordFormat is the first byte of an order record in ledger.db. A
// record of an earlier version is JSON (it starts with '{') and is still
// read.
const orderRecordFormat byte = 0xE1

// Order states as one byte in order records.
var orderStateCodes = [...]OrderState{1: OrderPending, 2: OrderHeld, 3: OrderSold, 4: OrderReleased}

func orderStateCode(s OrderState) byte {
	for i, v := range orderStateCodes {
		if v == s && i > 0 {
			return byte(i)
		}
	}
	return 0
}

// encodeOrderRecord appends o's ledger record to dst: the order without
// its id, which is the record's key.
func encodeOrderRecord(dst []byte, o *Order) []byte {
	dst = append(dst, orderRecordFormat, orderStateCode(o.State))
	dst = appendVarint(dst, o.Qty)
	dst = appendVarint(dst, o.CreatedAtUnixNano)
	dst = appendVarint(dst, o.ExpiresAtUnixNano)
	dst = appendString(dst, o.SKU)
	dst = appendString(dst, o.User)
	dst = appendString(dst, o.RequestID)
	dst = appendString(dst, o.Node)
	return appendString(dst, o.ReleaseReason)
}

// orderRecordSKU reads an order record's sale and state without decoding
// the rest; ok is false for a record it cannot read so.
func orderRecordSKU(b []byte) (sku []byte, state OrderState, ok bool) {
	if len(b) < 2 || b[0] != orderRecordFormat || int(b[1]) >= len(orderStateCodes) {
		return nil, "", false
	}
	d := decoder{b: b[2:]}
	d.varint()
	d.varint()
	d.varint()
	sku = d.bytes()
	return sku, orderStateCodes[b[1]], d.err == nil
}

// decodeOrderRecord reads the record of order id.
func decodeOrderRecord(id string, b []byte) (Order, error) {
	if len(b) > 0 && b[0] == '{' {
		var o Order
		if err := json.Unmarshal(b, &o); err != nil {
			return Order{}, fmt.Errorf("%w: order %q: %v", ErrMalformed, id, err)
		}
		return o, nil
	}
	if len(b) < 2 || b[0] != orderRecordFormat || int(b[1]) >= len(orderStateCodes) || b[1] == 0 {
		return Order{}, fmt.Errorf("%w: order %q: not an order record", ErrMalformed, id)
	}
	d := decoder{b: b[2:]}
	o := Order{ID: id, State: orderStateCodes[b[1]], Qty: d.varint(), CreatedAtUnixNano: d.varint(), ExpiresAtUnixNano: d.varint(),
		SKU: d.string(), User: d.string(), RequestID: d.string(), Node: d.string(), ReleaseReason: d.string()}
	if err := d.finish(); err != nil {
		return Order{}, fmt.Errorf("order %q: %w", id, err)
	}
	return o, nil
}
