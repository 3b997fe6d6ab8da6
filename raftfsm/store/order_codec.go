package store

import (
	"encoding/json"
	"fmt"
	"stockd.dev/stockd/internal/wire"
	"stockd.dev/stockd/stock"
)

// OrderRecordFormat is the first byte of an order record in ledger.db. A
// record of an earlier version is JSON (it starts with '{') and is still
// read.
const OrderRecordFormat byte = 0xE1

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

// EncodeOrderRecord appends o's ledger record to dst: the order without
// its id, which is the record's key.
func EncodeOrderRecord(dst []byte, o *stock.Order) []byte {
	dst = append(dst, OrderRecordFormat, orderStateCode(o.State))
	dst = wire.AppendVarint(dst, o.Qty)
	dst = wire.AppendVarint(dst, o.CreatedAtUnixNano)
	dst = wire.AppendVarint(dst, o.ExpiresAtUnixNano)
	dst = wire.AppendString(dst, o.SKU)
	dst = wire.AppendString(dst, o.User)
	dst = wire.AppendString(dst, o.RequestID)
	dst = wire.AppendString(dst, o.Node)
	return wire.AppendString(dst, o.ReleaseReason)
}

// OrderRecordSKU reads an order record's sale and state without decoding
// the rest; ok is false for a record it cannot read so.
func OrderRecordSKU(b []byte) (sku []byte, state stock.OrderState, ok bool) {
	if len(b) < 2 || b[0] != OrderRecordFormat || int(b[1]) >= len(orderStateCodes) {
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
	if len(b) < 2 || b[0] != OrderRecordFormat || int(b[1]) >= len(orderStateCodes) || b[1] == 0 {
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

// DecodeOrderRecord reads the record of order id.
func DecodeOrderRecord(id string, b []byte) (stock.Order, error) {
	if len(b) > 0 && b[0] == '{' {
		var o stock.Order
		if err := json.Unmarshal(b, &o); err != nil {
			return stock.Order{}, fmt.Errorf("%w: order %q: %v", wire.ErrMalformed, id, err)
		}
		return o, nil
	}
	if len(b) < 2 || b[0] != OrderRecordFormat || int(b[1]) >= len(orderStateCodes) || b[1] == 0 {
		return stock.Order{}, fmt.Errorf("%w: order %q: not an order record", wire.ErrMalformed, id)
	}
	d := wire.Decoder{B: b[2:]}
	o := stock.Order{ID: id, State: orderStateCodes[b[1]], Qty: d.Varint(), CreatedAtUnixNano: d.Varint(), ExpiresAtUnixNano: d.Varint(),
		SKU: d.String(), User: d.String(), RequestID: d.String(), Node: d.String(), ReleaseReason: d.String()}
	if err := d.Finish(); err != nil {
		return stock.Order{}, fmt.Errorf("order %q: %w", id, err)
	}
	return o, nil
}
