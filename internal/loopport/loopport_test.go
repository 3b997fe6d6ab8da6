package loopport

import (
	"net"
	"strconv"
	"testing"
)

func TestFreeIsOutsideTheEphemeralRangeAndNeverRepeats(t *testing.T) {
	lo, hi := ephemeralRange()
	from, to, ok := span(lo, hi)
	seen := map[string]bool{}
	for range 50 {
		addr, err := Free()
		if err != nil {
			t.Fatal(err)
		}
		if seen[addr] {
			t.Fatalf("%s handed out twice", addr)
		}
		seen[addr] = true
		_, p, err := net.SplitHostPort(addr)
		if err != nil {
			t.Fatal(err)
		}
		port, _ := strconv.Atoi(p)
		if ok && (port < from || port > to) {
			t.Fatalf("port %d outside %d-%d (ephemeral range %d-%d)", port, from, to, lo, hi)
		}
		// The port is free: this test can bind it.
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatalf("bind %s: %v", addr, err)
		}
		ln.Close()
	}
}

func TestParseRange(t *testing.T) {
	for _, c := range []struct {
		in     string
		lo, hi int
		ok     bool
	}{
		{"32768\t60999\n", 32768, 60999, true},
		{"1024 65535", 1024, 65535, true},
		{"60999 32768", 0, 0, false},
		{"32768", 0, 0, false},
		{"a b", 0, 0, false},
		{"0 100", 0, 0, false},
	} {
		lo, hi, ok := parseRange(c.in)
		if lo != c.lo || hi != c.hi || ok != c.ok {
			t.Errorf("parseRange(%q) = %d, %d, %v; want %d, %d, %v", c.in, lo, hi, ok, c.lo, c.hi, c.ok)
		}
	}
}

func TestSpan(t *testing.T) {
	for _, c := range []struct {
		lo, hi, from, to int
		ok               bool
	}{
		{32768, 60999, 10000, 32767, true}, // Linux's default: below
		{1024, 40000, 40001, 65535, true},  // a range from 1024: above
		{1024, 65000, 0, 0, false},         // no room either side
	} {
		from, to, ok := span(c.lo, c.hi)
		if from != c.from || to != c.to || ok != c.ok {
			t.Errorf("span(%d, %d) = %d, %d, %v; want %d, %d, %v", c.lo, c.hi, from, to, ok, c.from, c.to, c.ok)
		}
	}
}
