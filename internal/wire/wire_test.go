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
