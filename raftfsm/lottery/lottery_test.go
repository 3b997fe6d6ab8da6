package lottery

import (
	"bytes"
	"fmt"
	"slices"
	"testing"
)

func TestRanking_RankingOfAMillionIsAPermutation(t *testing.T) {
	if testing.Short() {
		t.Skip("a million entries")
	}
	r := Rank(bytes.Repeat([]byte{1}, 32), bytes.Repeat([]byte{2}, 32), 1_000_000)
	seen := make([]bool, len(r.Seqs))
	for rank, seq := range r.Seqs {
		if seen[seq-1] || r.RankOf[seq-1] != uint32(rank) {
			t.Fatalf("rank %d: seq %d seen before or ranked %d", rank, seq, r.RankOf[seq-1])
		}
		seen[seq-1] = true
	}
}

func BenchmarkRanking_Rank(b *testing.B) {
	for _, n := range []int64{10_000, 1_000_000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				Rank(bytes.Repeat([]byte{1}, 32), bytes.Repeat([]byte{2}, 32), n)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/entry")
		})
	}
}

func TestRanking_KeysSharingTheirFirstBytesRankByTheWholeKey(t *testing.T) {
	// Entries 1-6: 2, 4 and 5 share their first 8 bytes and differ after
	// them; 3 and 6 are equal keys (ranked by seq).
	keys := map[uint32][32]byte{}
	set := func(seq uint32, first, last byte) {
		var k [32]byte
		k[0], k[31] = first, last
		keys[seq] = k
	}
	set(1, 9, 0)
	set(2, 5, 3)
	set(3, 7, 1)
	set(4, 5, 1)
	set(5, 5, 2)
	set(6, 7, 1)
	r := rankBy(6, func(seq uint32) [32]byte { return keys[seq] })
	if want := []uint32{4, 5, 2, 3, 6, 1}; !slices.Equal(r.Seqs, want) {
		t.Fatalf("ranking %v, want %v", r.Seqs, want)
	}
	for rank, seq := range r.Seqs {
		if r.RankOf[seq-1] != uint32(rank) {
			t.Fatalf("rankOf[%d] = %d, want %d", seq, r.RankOf[seq-1], rank)
		}
	}
}
