package wire

import (
	"errors"
	"math"
	"testing"
)

// TestDecoder_ReadsWhatTheAppendsWrite: every field round-trips, the
// extremes included; a truncated input is malformed, and the first error
// sticks.
func TestDecoder_ReadsWhatTheAppendsWrite(t *testing.T) {
	ints := []int64{0, 1, -1, 63, -64, 64, math.MaxInt64, math.MinInt64}
	var b []byte
	for _, v := range ints {
		b = AppendVarint(b, v)
	}
	b = AppendUvarint(b, math.MaxUint64)
	b = AppendString(AppendString(b, "héllo"), "")
	d := Decoder{B: b}
	for _, want := range ints {
		if got := d.Varint(); got != want {
			t.Fatalf("varint %d read as %d", want, got)
		}
	}
	if d.Uvarint() != math.MaxUint64 || d.String() != "héllo" || d.String() != "" || d.Finish() != nil {
		t.Fatalf("round trip: %v", d.Err)
	}
	short := Decoder{B: AppendString(nil, "héllo")[:3]}
	if s := short.String(); s != "" || !errors.Is(short.Finish(), ErrMalformed) || short.Varint() != 0 {
		t.Fatalf("a truncated string read as %q, %v", s, short.Err)
	}
	if len(AppendUvarint(nil, 300)) != UvarintLen(300) {
		t.Fatal("UvarintLen disagrees with AppendUvarint")
	}
}

// TestDecoder_StringsShareOneAllocation: strings read together come back
// as written, in one allocation for all of them; a truncated run leaves
// them empty and the decoder failed.
func TestDecoder_StringsShareOneAllocation(t *testing.T) {
	b := AppendString(AppendString(AppendString(nil, "alice"), ""), "n1-7-x")
	b = AppendUvarint(b, 42)
	var got [3]string
	d := Decoder{B: b}
	d.Strings(got[:])
	if got != [3]string{"alice", "", "n1-7-x"} || d.Uvarint() != 42 || d.Finish() != nil {
		t.Fatalf("read %q, then %v", got, d.Err)
	}
	if n := testing.AllocsPerRun(100, func() {
		d := Decoder{B: b}
		d.Strings(got[:])
	}); n != 1 {
		t.Fatalf("%.0f allocations for three strings, want 1", n)
	}
	short := Decoder{B: b[:8]}
	got = [3]string{"x", "y", "z"}
	short.Strings(got[:])
	if got != [3]string{} || !errors.Is(short.Finish(), ErrMalformed) {
		t.Fatalf("a truncated run read as %q, %v", got, short.Err)
	}
}
