package raftfsm

import (
	"strconv"
	"testing"

	"github.com/hashicorp/raft"
)

// BenchmarkLedger_TakeBatches is the ledger's share of a batch deduct's
// unit: Takes of 100 entries, applied eight to a batch as raft hands them
// over, and written to the file after every fourth batch (the persister's
// work, on this goroutine so that it is counted). It reports the time a
// unit takes; each unit carries a request id, as a gateway's do. The
// baseline applies them under the earlier rules (global request ids), the
// other under scoped ones (ids keyed with their user, and the check for a
// reuse).
func BenchmarkLedger_TakeBatches(b *testing.B) {
	b.Run("rules=global", func(b *testing.B) { benchmarkTakeBatches(b, RulesGlobalRequestIDs) })
	b.Run("rules=scoped", func(b *testing.B) { benchmarkTakeBatches(b, RulesScopedRequestIDs) })
}

func benchmarkTakeBatches(b *testing.B, rules uint64) {
	const perTake, perBatch, batchesPerWrite = 100, 8, 4
	tl := newTestLedger(b)
	if rules > 0 {
		tl.applyTyped(0, &SetRules{Rules: rules})
	}
	units := int64(b.N)*perTake*perBatch + 1
	tl.apply(legacyCommand{Op: OpCreateSale, SKU: "s", Sale: &SaleConfig{Total: units}})
	tl.apply(legacyCommand{Op: OpLease, Node: "n1", SKU: "s", Qty: units})
	seq := uint64(1) << 40
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer() // the proposer's work, not the ledger's
		logs := make([]*raft.Log, perBatch)
		for j := range logs {
			c := &Take{Node: "n1", Entries: make([]TakeEntry, perTake)}
			for k := range c.Entries {
				seq++
				c.Entries[k] = TakeEntry{SKU: "s", Qty: 1, User: "u" + strconv.FormatUint(seq, 10),
					RequestID: "req-" + strconv.FormatUint(seq, 10), OrderID: "n1-" + strconv.FormatUint(seq, 36) + "-x"}
			}
			tl.index++
			logs[j] = &raft.Log{Index: tl.index, Term: 1, Type: raft.LogCommand, Data: EncodeCommand(nil, int64(tl.index), c)}
		}
		b.StartTimer()
		tl.l.ApplyBatch(logs)
		if i%batchesPerWrite == batchesPerWrite-1 {
			if err := tl.l.Flush(); err != nil {
				b.Fatal(err)
			}
		}
	}
	if err := tl.l.Flush(); err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*perTake*perBatch), "ns/unit")
	if a := checkAudit(b, tl.l, "s"); a.Row.Sold != int64(b.N)*perTake*perBatch {
		b.Fatalf("sold %d, want %d", a.Row.Sold, b.N*perTake*perBatch)
	}
}
