package counter

import (
	"testing"
	"unsafe"
)

func TestBucket_EdgesBelongToTheirBound(t *testing.T) {
	bounds := []float64{1, 2, 4}
	for _, c := range []struct {
		v    float64
		want int
	}{{0, 0}, {1, 0}, {1.5, 1}, {2, 1}, {4, 2}, {4.01, 3}, {1e9, 3}} {
		if got := Bucket(bounds, c.v); got != c.want {
			t.Errorf("Bucket(%v) = %d, want %d", c.v, got, c.want)
		}
	}
	if got := Bucket(nil, 5); got != 0 {
		t.Errorf("no bounds: %d", got)
	}
}

func TestPadded_OneCacheLineEach(t *testing.T) {
	if n := unsafe.Sizeof(Uint64{}); n != CacheLine {
		t.Fatalf("Uint64 is %d bytes", n)
	}
	if n := unsafe.Sizeof(Int64{}); n != CacheLine {
		t.Fatalf("Int64 is %d bytes", n)
	}
	var c [2]Uint64
	c[0].Add(3)
	c[1].Add(4)
	if c[0].Load() != 3 || c[1].Load() != 4 {
		t.Fatal("counters share state")
	}
}
