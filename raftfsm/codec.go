package raftfsm

import (
	"encoding/json"
	"fmt"

	"stockd/internal/wire"
	"stockd/stock"
)

// ErrMalformed marks bytes that are not a valid command or result: a
// sender that gets it back must not send the same bytes again.
var ErrMalformed = wire.ErrMalformed

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
	dst = wire.AppendVarint(dst, r.Qty)
	dst = wire.AppendUvarint(dst, r.Index)
	dst = wire.AppendString(dst, r.Detail)
	if r.Order != nil {
		dst = appendOrder(dst, r.Order)
	}
	if r.Takes != nil {
		dst = wire.AppendUvarint(dst, uint64(len(r.Takes)))
		for i := range r.Takes {
			dst = append(dst, byte(r.Takes[i].Outcome))
			dst = appendOrder(dst, &r.Takes[i].Order)
		}
	}
	if r.Entries != nil {
		dst = wire.AppendUvarint(dst, uint64(len(r.Entries)))
		for i := range r.Entries {
			e := &r.Entries[i]
			dst = append(dst, byte(e.Outcome))
			dst = wire.AppendString(wire.AppendString(wire.AppendString(dst, e.Entry.SKU), e.Entry.User), e.Entry.RequestID)
			dst = wire.AppendVarint(wire.AppendVarint(dst, e.Entry.Seq), e.Entry.AtUnixNano)
		}
	}
	return dst
}

// DecodeResult parses bytes written by EncodeResult.
func DecodeResult(b []byte) (*Result, error) {
	if len(b) < 3 || b[0] != resultFormat {
		return nil, fmt.Errorf("%w: not a result", ErrMalformed)
	}
	r := &Result{Outcome: stock.Outcome(b[1])}
	flags := b[2]
	d := wire.Decoder{B: b[3:]}
	r.Qty = d.Varint()
	r.Index = d.Uvarint()
	r.Detail = d.String()
	if flags&resultHasOrder != 0 {
		o := decodeOrder(&d)
		r.Order = &o
	}
	if flags&resultHasTakes != 0 {
		r.Takes = make([]TakeResult, d.Count(minOrderBytes+1))
		for i := range r.Takes {
			r.Takes[i].Outcome = stock.Outcome(d.Byte())
			r.Takes[i].Order = decodeOrder(&d)
		}
	}
	if flags&resultHasEntries != 0 {
		r.Entries = make([]EntryResult, d.Count(6))
		for i := range r.Entries {
			e := &r.Entries[i]
			e.Outcome = stock.Outcome(d.Byte())
			e.Entry.SKU, e.Entry.User, e.Entry.RequestID = d.String(), d.String(), d.String()
			e.Entry.Seq, e.Entry.AtUnixNano = d.Varint(), d.Varint()
		}
	}
	if err := d.Finish(); err != nil {
		return nil, fmt.Errorf("result: %w", err)
	}
	return r, nil
}

// minOrderBytes is the smallest encoded order (empty strings, one-byte
// numbers).
const minOrderBytes = 10

func appendOrder(b []byte, o *stock.Order) []byte {
	b = wire.AppendString(b, o.ID)
	b = wire.AppendString(b, o.SKU)
	b = wire.AppendString(b, o.User)
	b = wire.AppendVarint(b, o.Qty)
	b = wire.AppendString(b, string(o.State))
	b = wire.AppendString(b, o.RequestID)
	b = wire.AppendString(b, o.Node)
	b = wire.AppendVarint(b, o.CreatedAtUnixNano)
	b = wire.AppendVarint(b, o.ExpiresAtUnixNano)
	return wire.AppendString(b, o.ReleaseReason)
}

func decodeOrder(d *wire.Decoder) stock.Order {
	return stock.Order{
		ID: d.String(), SKU: d.String(), User: d.String(), Qty: d.Varint(),
		State: stock.OrderState(d.String()), RequestID: d.String(), Node: d.String(),
		CreatedAtUnixNano: d.Varint(), ExpiresAtUnixNano: d.Varint(), ReleaseReason: d.String(),
	}
}

// orderRecordFormat is the first byte of an order record in ledger.db. A
// record of an earlier version is JSON (it starts with '{') and is still
// read.
const orderRecordFormat byte = 0xE1

// Order states as one byte in order records.
var orderStateCodes = [...]stock.OrderState{1: stock.OrderPending, 2: stock.OrderHeld, 3: stock.OrderSold, 4: stock.OrderReleased}

func orderStateCode(s stock.OrderState) byte {
	for i, v := range orderStateCodes {
		if v == s && i > 0 {
			return byte(i)
		}
	}
	return 0
}

// encodeOrderRecord appends o's ledger record to dst: the order without
// its id, which is the record's key.
func encodeOrderRecord(dst []byte, o *stock.Order) []byte {
	dst = append(dst, orderRecordFormat, orderStateCode(o.State))
	dst = wire.AppendVarint(dst, o.Qty)
	dst = wire.AppendVarint(dst, o.CreatedAtUnixNano)
	dst = wire.AppendVarint(dst, o.ExpiresAtUnixNano)
	dst = wire.AppendString(dst, o.SKU)
	dst = wire.AppendString(dst, o.User)
	dst = wire.AppendString(dst, o.RequestID)
	dst = wire.AppendString(dst, o.Node)
	return wire.AppendString(dst, o.ReleaseReason)
}

// orderRecordSKU reads an order record's sale and state without decoding
// the rest; ok is false for a record it cannot read so.
func orderRecordSKU(b []byte) (sku []byte, state stock.OrderState, ok bool) {
	if len(b) < 2 || b[0] != orderRecordFormat || int(b[1]) >= len(orderStateCodes) {
		return nil, "", false
	}
	d := wire.Decoder{B: b[2:]}
	d.Varint()
	d.Varint()
	d.Varint()
	sku = d.Bytes()
	return sku, orderStateCodes[b[1]], d.Err == nil
}

// orderRecordTally reads what the audit counts of an order record (its
// sale, state and units) in place, checking that the whole record reads;
// ok is false for a record it cannot read so (a record of the JSON
// format among them: decodeOrderRecord reads those).
func orderRecordTally(b []byte) (sku []byte, state stock.OrderState, qty int64, ok bool) {
	if len(b) < 2 || b[0] != orderRecordFormat || int(b[1]) >= len(orderStateCodes) || b[1] == 0 {
		return nil, "", 0, false
	}
	d := wire.Decoder{B: b[2:]}
	qty = d.Varint()
	d.Varint()
	d.Varint()
	sku = d.Bytes()
	for range 4 { // user, request id, node, release reason
		d.Bytes()
	}
	return sku, orderStateCodes[b[1]], qty, d.Finish() == nil
}

// decodeOrderRecord reads the record of order id.
func decodeOrderRecord(id string, b []byte) (stock.Order, error) {
	if len(b) > 0 && b[0] == '{' {
		var o stock.Order
		if err := json.Unmarshal(b, &o); err != nil {
			return stock.Order{}, fmt.Errorf("%w: order %q: %v", ErrMalformed, id, err)
		}
		return o, nil
	}
	if len(b) < 2 || b[0] != orderRecordFormat || int(b[1]) >= len(orderStateCodes) || b[1] == 0 {
		return stock.Order{}, fmt.Errorf("%w: order %q: not an order record", ErrMalformed, id)
	}
	d := wire.Decoder{B: b[2:]}
	o := stock.Order{ID: id, State: orderStateCodes[b[1]], Qty: d.Varint(), CreatedAtUnixNano: d.Varint(), ExpiresAtUnixNano: d.Varint(),
		SKU: d.String(), User: d.String(), RequestID: d.String(), Node: d.String(), ReleaseReason: d.String()}
	if err := d.Finish(); err != nil {
		return stock.Order{}, fmt.Errorf("order %q: %w", id, err)
	}
	return o, nil
}
