package raftfsm

import (
	"errors"
	"reflect"
	"stockd.dev/stockd/raftfsm/command"
	"stockd.dev/stockd/raftfsm/store"
	"stockd.dev/stockd/stock"
	"testing"
)

func TestCodec_ResultRoundTrips(t *testing.T) {
	f := func(r *command.Result) {
		t.Helper()
		b := command.EncodeResult(nil, r)
		got, err := command.DecodeResult(b)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, r) {
			t.Fatalf("got %+v, want %+v", got, r)
		}
		if _, err := command.DecodeResult(b[:len(b)-1]); !errors.Is(err, ErrMalformed) {
			t.Fatalf("cut result: err %v, want ErrMalformed", err)
		}
	}
	o := stock.Order{ID: "o", SKU: "s", User: "u", Qty: 2, State: stock.OrderHeld, RequestID: "r", Node: "n1", CreatedAtUnixNano: 5, ExpiresAtUnixNano: 6}
	f(&command.Result{Outcome: stock.OutcomeOK, Qty: 4, Index: 99})
	f(&command.Result{Outcome: stock.OutcomeInvalidState, Order: &o, Detail: "hold not yet expired", Index: 1})
	f(&command.Result{Outcome: stock.OutcomeOK, Takes: []command.TakeResult{{Outcome: stock.OutcomeOK, Order: o}, {Outcome: stock.OutcomeUserLimit}}, Index: 7})
	f(&command.Result{Outcome: stock.OutcomeOK, Tickets: []command.TicketResult{{Outcome: stock.OutcomeOK, Joined: 3}, {Outcome: stock.OutcomeSame, Joined: 1}, {Outcome: stock.OutcomeSoldOut}}, Index: 8})
}

func FuzzDecodeCommand(f *testing.F) {
	f.Add(EncodeCommand(nil, 1, &Take{Node: "n1", Entries: []TakeEntry{{SKU: "a", Qty: 1, User: "u", OrderID: "o"}}}))
	f.Add(EncodeCommand(nil, 1, &CreateSale{SKU: "a", Sale: SaleConfig{Total: 3}}))
	f.Fuzz(func(t *testing.T, b []byte) {
		at, c, err := DecodeCommand(b)
		if err != nil {
			return
		}
		// Whatever decodes must encode back to a command that decodes the same.
		at2, c2, err := DecodeCommand(EncodeCommand(nil, at, c))
		if err != nil || at2 != at || !reflect.DeepEqual(c, c2) {
			t.Fatalf("re-encode of %+v: %+v %v", c, c2, err)
		}
	})
}

func TestCodec_OrderRecordsRoundTripAndReadJSON(t *testing.T) {
	o := stock.Order{ID: "n1-5-x", SKU: "s", User: "u", Qty: 3, State: stock.OrderHeld, RequestID: "r", Node: "n1", CreatedAtUnixNano: 5, ExpiresAtUnixNano: 9, ReleaseReason: ""}
	got, err := store.DecodeOrderRecord(o.ID, store.EncodeOrderRecord(nil, &o))
	if err != nil || !reflect.DeepEqual(got, o) {
		t.Fatalf("round trip: %+v %v, want %+v", got, err, o)
	}
	legacy := []byte(`{"order_id":"n1-5-x","sku":"s","user":"u","qty":3,"state":"held","request_id":"r","node":"n1","created_at":5,"expires_at":9}`)
	if got, err := store.DecodeOrderRecord(o.ID, legacy); err != nil || !reflect.DeepEqual(got, o) {
		t.Fatalf("json record: %+v %v", got, err)
	}
	if _, err := store.DecodeOrderRecord("x", []byte{store.OrderRecordFormat, 9}); !errors.Is(err, ErrMalformed) {
		t.Fatalf("bad state code: %v", err)
	}
}
