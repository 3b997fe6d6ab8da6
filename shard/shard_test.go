package shard

import (
	"sync"
	"sync/atomic"
	"testing"

	"pgregory.net/rapid"
)

func TestBuckets_TakeNeverExceedsLoaded(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		buckets := New(rapid.IntRange(1, 17).Draw(t, "buckets"))
		loaded := rapid.Int64Range(0, 500).Draw(t, "loaded")
		if loaded > 0 {
			buckets.Load(loaded)
		}
		workers := rapid.IntRange(1, 16).Draw(t, "workers")
		attempts := rapid.IntRange(1, 200).Draw(t, "attempts")
		maxQty := rapid.Int64Range(1, 5).Draw(t, "maxQty")
		putBack := rapid.Bool().Draw(t, "putBack")

		var taken atomic.Int64
		var wg sync.WaitGroup
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func(w int) {
				defer wg.Done()
				for i := 0; i < attempts; i++ {
					qty := int64(i)%maxQty + 1
					if !buckets.Take(uint32(w), qty) {
						continue
					}
					// Some winners give their units back, as a rejected
					// take does; they must become takeable again.
					if putBack && i%7 == 0 {
						buckets.Put(uint32(w+i), qty)
						continue
					}
					taken.Add(qty)
				}
			}(w)
		}
		wg.Wait()

		left := buckets.Units()
		if taken.Load() > loaded {
			t.Fatalf("oversold: took %d of %d loaded", taken.Load(), loaded)
		}
		if taken.Load()+left != loaded {
			t.Fatalf("conservation: taken %d + left %d != loaded %d", taken.Load(), left, loaded)
		}
		for i := range buckets.counters {
			if v := buckets.counters[i].Load(); v < 0 {
				t.Fatalf("bucket %d below zero: %d", i, v)
			}
		}
		if drained := buckets.Drain(); drained != left || buckets.Units() != 0 {
			t.Fatalf("drain returned %d, want %d; %d left after", drained, left, buckets.Units())
		}
	})
}

func TestBuckets_TakeSpansSiblings(t *testing.T) {
	b := New(4)
	b.Load(4) // one unit per bucket
	if !b.Take(0, 3) {
		t.Fatal("take of 3 from 4 units spread over buckets failed")
	}
	if b.Take(2, 2) {
		t.Fatal("take of 2 from 1 unit succeeded")
	}
	if got := b.Units(); got != 1 {
		t.Fatalf("units after failed take = %d, want 1 (a failed take must give back)", got)
	}
	if !b.Take(3, 1) || b.Units() != 0 {
		t.Fatalf("last unit not takeable; units = %d", b.Units())
	}
}

func TestBuckets_LoadSpreadsEvenly(t *testing.T) {
	f := func(buckets int, qty int64) {
		t.Helper()
		b := New(buckets)
		b.Load(qty)
		lo, hi := b.counters[0].Load(), b.counters[0].Load()
		for i := range b.counters {
			v := b.counters[i].Load()
			lo, hi = min(lo, v), max(hi, v)
		}
		if hi-lo > 1 || b.Units() != qty {
			t.Fatalf("Load(%d) over %d buckets: min %d max %d sum %d", qty, buckets, lo, hi, b.Units())
		}
	}
	f(1, 10)
	f(3, 10)
	f(16, 5)
	f(16, 1000)
}

func TestBuckets_TakeDoesNotAllocate(t *testing.T) {
	b := New(8)
	b.Load(1 << 20)
	allocs := testing.AllocsPerRun(1000, func() { b.Take(3, 1) })
	if allocs != 0 {
		t.Fatalf("Take allocates %.1f times per call", allocs)
	}
}

func TestBuckets_TakeUpToTakesWhatIsThere(t *testing.T) {
	b := New(4)
	b.Load(10)
	if got := b.TakeUpTo(6); got != 6 || b.Units() != 4 {
		t.Fatalf("TakeUpTo(6) of 10 = %d, %d left; want 6, 4", got, b.Units())
	}
	if got := b.TakeUpTo(9); got != 4 || b.Units() != 0 {
		t.Fatalf("TakeUpTo(9) of 4 = %d, %d left; want 4, 0", got, b.Units())
	}
}
