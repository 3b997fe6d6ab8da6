package stock

import (
	"errors"
	"testing"
)

// A cursor's wire form reads back as the same cursor; forms that could mean
// something else are refused.
func TestCursor_WireFormReadsBackAndRefusesOtherForms(t *testing.T) {
	for _, c := range []Cursor{{}, {Index: 1, Seq: 1}, {Index: 1 << 40, Seq: 7}} {
		got, err := ParseCursor(c.String())
		if err != nil || got != c {
			t.Fatalf("%+v wrote %q, read back %+v, %v", c, c.String(), got, err)
		}
	}
	if c, err := ParseCursor(""); err != nil || c != (Cursor{}) {
		t.Fatalf(`"" is the start: %+v %v`, c, err)
	}
	for _, s := range []string{"5", "0-1", "1-0", "-1-2", "1-2-3", "a-b", "1- 2", "+1-2"} {
		if c, err := ParseCursor(s); !errors.Is(err, ErrBadCursor) {
			t.Errorf("%q read as %+v, %v; want ErrBadCursor", s, c, err)
		}
	}
}

// CheckLaw names a row whose terms do not add up, or that has a negative
// one; a row that keeps the law passes.
func TestSKU_CheckLawNamesABrokenRow(t *testing.T) {
	ok := SKU{SKU: "a", Total: 10, Available: 3, Leased: map[string]int64{"n1": 2, "n2": 1}, Held: 1, Sold: 3}
	if err := ok.CheckLaw(); err != nil {
		t.Fatalf("a row that keeps the law: %v", err)
	}
	for _, bad := range []SKU{
		{SKU: "a", Total: 10, Available: 4, Leased: map[string]int64{"n1": 2, "n2": 1}, Held: 1, Sold: 3},
		{SKU: "a", Total: 10, Available: 7, Leased: map[string]int64{"n1": -1}, Held: 1, Sold: 3},
		{SKU: "a", Total: 0, Available: 1, Held: -1},
	} {
		if err := bad.CheckLaw(); err == nil {
			t.Errorf("%+v passed the law", bad)
		}
	}
	c := ok.Clone()
	c.Leased["n1"] = 9
	if ok.Leased["n1"] != 2 {
		t.Fatal("a clone shares its leases with the row")
	}
}
