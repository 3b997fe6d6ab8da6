package command

import (
	"errors"
	"reflect"
	"stockd.dev/stockd/internal/wire"
	"stockd.dev/stockd/stock"
	"strings"
	"testing"
)

func TestCodec_EveryCommandRoundTrips(t *testing.T) {
	f := func(c Command) {
		t.Helper()
		b := EncodeCommand(nil, 1234567, c)
		at, got, err := DecodeCommand(b)
		if err != nil {
			t.Fatalf("decode %T: %v", c, err)
		}
		if at != 1234567 || !reflect.DeepEqual(got, c) {
			t.Fatalf("round trip of %T: at %d, got %+v, want %+v", c, at, got, c)
		}
		// Every strict prefix is refused, never half-read.
		for n := 0; n < len(b); n++ {
			if _, _, err := DecodeCommand(b[:n]); !errors.Is(err, wire.ErrMalformed) {
				t.Fatalf("%T cut at %d of %d bytes: err %v, want wire.ErrMalformed", c, n, len(b), err)
			}
		}
	}
	f(&CreateSale{SKU: "a", Sale: stock.SaleConfig{Total: 10, StartAtUnixNano: -5, PerUser: 2, HoldTTLNanos: 9e9}})
	f(&Restock{SKU: "a", Qty: 1 << 40})
	f(&Lease{Node: "n1", SKU: "a", Want: 7})
	f(&Return{Node: "n2", SKU: "b", Qty: 3})
	f(&Take{Node: "n3", Entries: []TakeEntry{{SKU: "a", Qty: 1, User: "u", RequestID: "r", OrderID: "o"}, {SKU: "b", Qty: 2, User: "v", OrderID: "p"}}})
	f(&Take{Node: "n3", Entries: []TakeEntry{}})
	f(&Take{Node: "n3", Entries: []TakeEntry{{SKU: "q", Qty: 1, User: "u", OrderID: "o"}, {SKU: "q", Qty: 1, User: "v", OrderID: "p", Ticket: "0123456789abcdef0123456789abcdef"}}})
	f(&Confirm{OrderID: "o1"})
	f(&Release{OrderID: "o1", Reason: "cancelled"})
	f(&Reclaim{Node: "n2"})
	f(&Register{Node: "n1", Addr: "127.0.0.1:8080"})
	f(&Expire{OrderIDs: []string{"a", "b"}})
	f(&PruneRequests{BeforeUnixNano: 99, MaxKeep: 1000})
	f(&Join{Entries: []JoinEntry{{SKU: "a", User: "u", Secret: "0123456789abcdef0123456789abcdef"}, {SKU: "a", User: "v", Secret: "s"}}})
	f(&QueueTick{SKU: "a", Through: 12345})
	f(&RotateQueueKey{SKU: "a", Key: []byte("0123456789abcdef0123456789abcdef")})
}

// TestCodec_QueuedSaleRoundTrips: a queued sale's settings follow the
// lottery's fields and secret; a sale without them keeps the shorter
// forms of earlier versions.
func TestCodec_QueuedSaleRoundTrips(t *testing.T) {
	for _, c := range []*CreateSale{
		{SKU: "q", Sale: stock.SaleConfig{Total: 10, StartAtUnixNano: 5, Admission: stock.AdmissionQueue, QueueOveradmitMilli: 1500, QueueAdmitTTLNanos: 6e10}, Secret: []byte("seed-and-key")},
		{SKU: "q", Sale: stock.SaleConfig{Total: 10, Admission: stock.AdmissionQueue}},
		{SKU: "l", Sale: stock.SaleConfig{Total: 10, Mode: stock.SaleModeLottery, EntriesCloseAtUnixNano: 9}, Secret: []byte("s")},
	} {
		_, got, err := DecodeCommand(EncodeCommand(nil, 1, c))
		if err != nil || !reflect.DeepEqual(got, c) {
			t.Fatalf("round trip of %+v: got %+v, %v", c, got, err)
		}
	}
	plain := EncodeCommand(nil, 1, &CreateSale{SKU: "p", Sale: stock.SaleConfig{Total: 10}})
	lottery := EncodeCommand(nil, 1, &CreateSale{SKU: "p", Sale: stock.SaleConfig{Total: 10, Mode: stock.SaleModeLottery}})
	if len(plain) != 2+1+2+1+1+1+1 || len(lottery) != len(plain)+1+len(stock.SaleModeLottery)+1+1 {
		t.Fatalf("a plain sale takes %d bytes and a lottery %d: the earlier forms changed", len(plain), len(lottery))
	}
}

func TestCodec_TakeEntrySizeBoundsTheEncoding(t *testing.T) {
	c := &Take{Node: "node-1"}
	want := TakeHeaderSize(c.Node)
	for i := range 300 {
		e := TakeEntry{SKU: "sku", Qty: int64(i + 1), User: strings.Repeat("u", i%130), RequestID: "req", OrderID: "n1-abcdef"}
		want += e.EncodedSize()
		c.Entries = append(c.Entries, e)
	}
	if got := len(EncodeCommand(nil, 1<<62, c)); got > want {
		t.Fatalf("encoded take is %d bytes, the size estimate %d", got, want)
	}
}

func TestCodec_RefusesGarbage(t *testing.T) {
	f := func(name string, b []byte) {
		t.Helper()
		if _, _, err := DecodeCommand(b); !errors.Is(err, wire.ErrMalformed) {
			t.Fatalf("%s: err %v, want wire.ErrMalformed", name, err)
		}
	}
	f("empty", nil)
	f("unknown format", []byte{0x01, byte(OpTake)})
	f("unknown op", []byte{commandFormat, 200, 0})
	f("trailing bytes", append(EncodeCommand(nil, 1, &Reclaim{Node: "n1"}), 0))
	// A count far larger than the bytes that follow must not allocate.
	f("forged count", []byte{commandFormat, byte(OpTake), 2, 0, 0xff, 0xff, 0xff, 0xff, 0x0f})
	f("bad json", []byte(`{"op":`))
}

func TestCodec_ReadsLegacyJSONEntries(t *testing.T) {
	at, c, err := DecodeCommand([]byte(`{"op":3,"at":77,"node":"n1","sku":"a","qty":5}`))
	if err != nil {
		t.Fatal(err)
	}
	if want := (&Lease{Node: "n1", SKU: "a", Want: 5}); at != 77 || !reflect.DeepEqual(c, want) {
		t.Fatalf("got %d %+v, want 77 %+v", at, c, want)
	}
}
