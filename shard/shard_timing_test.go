package shard

import (
	"sync"
	"sync/atomic"
	"testing"
)

// The three ways to keep a hot stock counter, measured in one run so the
// ratios hold on a noisy machine: a mutex counter (pessimistic), one shared
// atomic with CAS (optimistic), and per-core buckets with a sticky hint.
// Stock is large enough that no variant runs out during a run.

const benchStockUnits = 1 << 40

func BenchmarkTake_Mutex(b *testing.B) {
	var mu sync.Mutex
	units := int64(benchStockUnits)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			mu.Lock()
			if units > 0 {
				units--
			}
			mu.Unlock()
		}
	})
}

func BenchmarkTake_SharedAtomic(b *testing.B) {
	var units atomic.Int64
	units.Store(benchStockUnits)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			takeFrom(&units, 1)
		}
	})
}

func BenchmarkTake_Buckets(b *testing.B) {
	buckets := New(16)
	buckets.Load(benchStockUnits)
	var workers atomic.Uint32
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		hint := workers.Add(1) // sticky per worker, as a connection is
		for pb.Next() {
			if !buckets.Take(hint, 1) {
				b.Error("buckets ran dry")
				return
			}
		}
	})
}

// BenchmarkTake_BucketsSoldOut is the loser's path once stock is gone: every
// bucket is scanned and found empty.
func BenchmarkTake_BucketsSoldOut(b *testing.B) {
	buckets := New(16)
	var workers atomic.Uint32
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		hint := workers.Add(1)
		for pb.Next() {
			if buckets.Take(hint, 1) {
				b.Error("took from empty buckets")
				return
			}
		}
	})
}
