package raftfsm

import (
	"errors"
	"fmt"
	"hash/maphash"
	"reflect"
	"stockd/raftfsm/store"
	"stockd/stock"
	"testing"
)

func TestCodec_ResultRoundTrips(t *testing.T) {
	f := func(r *Result) {
		t.Helper()
		b := EncodeResult(nil, r)
		got, err := DecodeResult(b)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, r) {
			t.Fatalf("got %+v, want %+v", got, r)
		}
		if _, err := DecodeResult(b[:len(b)-1]); !errors.Is(err, ErrMalformed) {
			t.Fatalf("cut result: err %v, want ErrMalformed", err)
		}
	}
	o := stock.Order{ID: "o", SKU: "s", User: "u", Qty: 2, State: stock.OrderHeld, RequestID: "r", Node: "n1", CreatedAtUnixNano: 5, ExpiresAtUnixNano: 6}
	f(&Result{Outcome: stock.OutcomeOK, Qty: 4, Index: 99})
	f(&Result{Outcome: stock.OutcomeInvalidState, Order: &o, Detail: "hold not yet expired", Index: 1})
	f(&Result{Outcome: stock.OutcomeOK, Takes: []TakeResult{{Outcome: stock.OutcomeOK, Order: o}, {Outcome: stock.OutcomeUserLimit}}, Index: 7})
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

func TestRequestIndex_SharedHashGoesToExact(t *testing.T) {
	r := newRequestIndex(maphash.MakeSeed())
	r.add("a", 1)
	// Another id already holds b's hash (added as add would: to the
	// filter too): b must not overwrite it.
	h := maphash.String(r.seed, "b")
	r.byHash.Put(h, 7)
	r.filter.Add(h)
	r.add("b", 2)
	if at, ok := r.candidate([]byte("b")); !ok || at != 2 {
		t.Fatalf("b: %d %v, want 2 from exact", at, ok)
	}
	if at, ok := r.candidate([]byte("a")); !ok || at != 1 || r.len() != 3 {
		t.Fatalf("a: %d %v, len %d", at, ok, r.len())
	}
	r.remove("b", 2)
	if at, _ := r.candidate([]byte("b")); at != 7 {
		t.Fatalf("after removing b its hash still names the other id's record (%d), which the caller's check rejects", at)
	}
	r.remove("a", 1)
	if _, ok := r.candidate([]byte("a")); ok || r.len() != 1 {
		t.Fatalf("a after removal: %v, len %d", ok, r.len())
	}
}

// TestRequestIndex_AddAllIsAddOneByOne indexes the same ids, some sharing
// a hash with an id held before, through add one by one and through
// addAll (more than one chunk), and checks both indexes answer alike.
func TestRequestIndex_AddAllIsAddOneByOne(t *testing.T) {
	seed := maphash.MakeSeed()
	one, all := newRequestIndex(seed), newRequestIndex(seed)
	var adds []requestAdd
	for i := range 1000 {
		adds = append(adds, requestAdd{id: fmt.Sprintf("id-%d", i), at: int64(i + 1)})
	}
	// Ten ids whose hash another record holds already: they go to exact.
	for _, r := range []*requestIndex{one, all} {
		for _, a := range adds[:10] {
			h := maphash.String(seed, a.id)
			r.byHash.Put(h, -1)
			r.filter.Add(h)
		}
	}
	for _, a := range adds {
		one.add(a.id, a.at)
	}
	all.addAll(adds)
	if one.len() != all.len() || len(all.exact) != 10 {
		t.Fatalf("len %d (one by one) against %d (addAll), %d exact, want 10", one.len(), all.len(), len(all.exact))
	}
	for _, a := range adds {
		at, ok := all.candidate([]byte(a.id))
		at1, ok1 := one.candidate([]byte(a.id))
		if !ok || at != a.at || at != at1 || ok != ok1 {
			t.Fatalf("%s: addAll's index gives %d, %v; add's %d, %v; want %d", a.id, at, ok, at1, ok1, a.at)
		}
	}
}
