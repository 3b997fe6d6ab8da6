package hashfilter

import (
	"math/rand/v2"
	"sync"
	"testing"
)

func TestFilter_NeverForgetsAndRarelyLies(t *testing.T) {
	f := New(20) // a million bits for 131,072 entries
	r := rand.New(rand.NewPCG(1, 2))
	added := make([]uint64, f.Capacity())
	for i := range added {
		added[i] = r.Uint64()
		f.Add(added[i])
	}
	for _, h := range added {
		if !f.MayContain(h) {
			t.Fatalf("%x added but not found", h)
		}
	}
	falseMaybes := 0
	const probesN = 100_000
	for range probesN {
		if f.MayContain(r.Uint64()) {
			falseMaybes++
		}
	}
	if rate := float64(falseMaybes) / probesN; rate > 0.05 {
		t.Fatalf("false maybe rate %.3f at capacity, want under 0.05", rate)
	}
}

func TestFilter_ConcurrentAddsAllVisible(t *testing.T) {
	f := New(16)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 500 {
				f.Add(uint64(g)<<40 | uint64(i)*0x9e3779b97f4a7c15)
			}
		}()
	}
	wg.Wait()
	for g := range 8 {
		for i := range 500 {
			if !f.MayContain(uint64(g)<<40 | uint64(i)*0x9e3779b97f4a7c15) {
				t.Fatalf("lost an add of goroutine %d", g)
			}
		}
	}
}

func BenchmarkFilter_MayContain(b *testing.B) {
	f := New(24)
	for i := range uint64(1 << 20) {
		f.Add(i * 0x9e3779b97f4a7c15)
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		h := uint64(12345)
		for pb.Next() {
			h += 0x9e3779b97f4a7c15
			f.MayContain(h)
		}
	})
}

// TestFilter_LineIsInTheBlockMayContainReads: the word Line returns
// starts the block of eight words, one cache line, that MayContain reads.
func TestFilter_LineIsInTheBlockMayContainReads(t *testing.T) {
	f := New(16)
	for h := uint64(1); h < 1<<20; h = h*3 + 7 {
		w, blk := f.Line(h), f.block(h)
		if w != &blk[0] {
			t.Fatalf("Line(%#x) is not the first word of its block", h)
		}
	}
}
