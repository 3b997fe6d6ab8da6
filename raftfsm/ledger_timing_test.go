package raftfsm

import (
	"os"
	"stockd.dev/stockd/raftfsm/store"
	"stockd.dev/stockd/stock"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	bolt "go.etcd.io/bbolt"
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

// BenchmarkLedger_SingleDeductTakes is the ledger's share of a single
// committed deduct under load: the committer's Takes of 24 wins (what
// 64 connections give it), one raft entry a batch, written to the file
// every 25 batches (the persister's 50 ms at that rate). The entries are
// made before the timer starts (stopping and starting it each batch
// would cost more than a batch of 24).
func BenchmarkLedger_SingleDeductTakes(b *testing.B) {
	const perTake, batchesPerWrite = 24, 25
	tl := newTestLedger(b)
	tl.applyTyped(0, &SetRules{Rules: RulesScopedRequestIDs})
	units := int64(b.N*perTake) + 1
	tl.apply(legacyCommand{Op: OpCreateSale, SKU: "s", Sale: &SaleConfig{Total: units}})
	tl.apply(legacyCommand{Op: OpLease, Node: "n1", SKU: "s", Qty: units})
	seq := uint64(1) << 40
	logs := make([]*raft.Log, b.N)
	for i := range logs {
		logs[i] = tl.benchTakeLog(&seq, perTake)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i, log := range logs {
		tl.l.ApplyBatch([]*raft.Log{log})
		tl.flushEvery(b, i, batchesPerWrite)
	}
	tl.flush(b)
	b.StopTimer()
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*perTake), "ns/unit")
	if a := checkAudit(b, tl.l, "s"); a.Row.Sold != int64(b.N*perTake) {
		b.Fatalf("sold %d, want %d", a.Row.Sold, b.N*perTake)
	}
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
			logs[j] = tl.benchTakeLog(&seq, perTake)
		}
		b.StartTimer()
		tl.l.ApplyBatch(logs)
		tl.flushEvery(b, i, batchesPerWrite)
	}
	tl.flush(b)
	b.StopTimer()
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*perTake*perBatch), "ns/unit")
	if a := checkAudit(b, tl.l, "s"); a.Row.Sold != int64(b.N)*perTake*perBatch {
		b.Fatalf("sold %d, want %d", a.Row.Sold, b.N*perTake*perBatch)
	}
}

// benchTakeLog is the next raft entry of a Take of n wins of sale "s" by
// node n1, each with its own user, request id and order id (numbered on
// from *seq).
// flushEvery writes the ledger file after every nth apply (i counts
// from 0), as the persister would.
func (tl *testLedger) flushEvery(b *testing.B, i, n int) {
	if i%n == n-1 {
		tl.flush(b)
	}
}

func (tl *testLedger) flush(b *testing.B) {
	if err := tl.l.Flush(); err != nil {
		b.Fatal(err)
	}
}

func (tl *testLedger) benchTakeLog(seq *uint64, n int) *raft.Log {
	c := &Take{Node: "n1", Entries: make([]TakeEntry, n)}
	for k := range c.Entries {
		*seq++
		c.Entries[k] = TakeEntry{SKU: "s", Qty: 1, User: "u" + strconv.FormatUint(*seq, 10),
			RequestID: "req-" + strconv.FormatUint(*seq, 10), OrderID: "n1-" + strconv.FormatUint(*seq, 36) + "-x"}
	}
	tl.index++
	return &raft.Log{Index: tl.index, Term: 1, Type: raft.LogCommand, Data: EncodeCommand(nil, int64(tl.index), c)}
}

// BenchmarkLedger_NewRequestID is the ledger's share of a deduct with a
// new request id, at 50,000 and at 5 million ids held, side by side: the
// engine asks MayHoldRequest, and on a maybe looks the id up
// (LookupRequest), as answerFromLedger does. "Known new in constant
// time" means the two rows cost the same.
func BenchmarkLedger_NewRequestID(b *testing.B) {
	for _, held := range benchRequestIDsHeld() {
		b.Run("ids="+strconv.Itoa(held), func(b *testing.B) {
			tl := newTestLedger(b)
			tl.applyTyped(0, &SetRules{Rules: RulesCurrent})
			fillRequests(b, tl, held)
			b.ReportAllocs()
			b.ResetTimer()
			maybes := 0
			user, id := []byte("new-user"), make([]byte, 0, 32)
			for i := 0; i < b.N; i++ {
				id = strconv.AppendInt(append(id[:0], "new-"...), int64(i), 10)
				if tl.l.MayHoldRequest(user, id) {
					maybes++
					if _, ok := tl.l.LookupRequest(user, id); ok {
						b.Fatal("a new id was found")
					}
				}
			}
			b.ReportMetric(float64(maybes)/float64(b.N), "maybes/op")
		})
	}
}

// fillRequests applies Takes of n orders, each with its own user and
// request id, and writes them to the file.
func fillRequests(b *testing.B, tl *testLedger, n int) {
	b.Helper()
	const perTake = 1000
	tl.apply(legacyCommand{Op: OpCreateSale, SKU: "s", Sale: &SaleConfig{Total: int64(n) + 1}})
	tl.apply(legacyCommand{Op: OpLease, Node: "n1", SKU: "s", Qty: int64(n)})
	for done := 0; done < n; done += perTake {
		c := &Take{Node: "n1", Entries: make([]TakeEntry, min(perTake, n-done))}
		for k := range c.Entries {
			seq := strconv.Itoa(done + k)
			// Order ids of the engine's shape: the ledger keeps them in blocks.
			id := "n1-" + strconv.FormatUint(uint64(done+k+1), 36) + "-z" + seq
			c.Entries[k] = TakeEntry{SKU: "s", Qty: 1, User: "u" + seq, RequestID: "r-" + seq, OrderID: id}
		}
		tl.index++
		tl.l.ApplyBatch([]*raft.Log{{Index: tl.index, Term: 1, Type: raft.LogCommand, Data: EncodeCommand(nil, int64(tl.index), c)}})
		if done%(100*perTake) == 0 {
			if err := tl.l.Flush(); err != nil {
				b.Fatal(err)
			}
		}
	}
	if err := tl.l.Flush(); err != nil {
		b.Fatal(err)
	}
}

// benchRequestIDsHeld is how many ids the rows of
// BenchmarkLedger_NewRequestID hold (STOCKD_BENCH_IDS overrides, e.g.
// "50000,500000").
func benchRequestIDsHeld() []int {
	out := []int{50_000, 5_000_000}
	if v := os.Getenv("STOCKD_BENCH_IDS"); v != "" {
		out = out[:0]
		for _, f := range strings.Split(v, ",") {
			if n, err := strconv.Atoi(f); err == nil {
				out = append(out, n)
			}
		}
	}
	return out
}

// BenchmarkLedger_RepeatRequestID is the ledger's share of a repeated
// request id's answer (a retry): the id's record, then its order, read
// from the file as answerFromLedger does.
func BenchmarkLedger_RepeatRequestID(b *testing.B) {
	const held = 50_000
	tl := newTestLedger(b)
	tl.applyTyped(0, &SetRules{Rules: RulesCurrent})
	fillRequests(b, tl, held)
	b.ReportAllocs()
	b.ResetTimer()
	user, id := make([]byte, 0, 16), make([]byte, 0, 16)
	for i := 0; i < b.N; i++ {
		seq := int64(i*7919) % held
		user = strconv.AppendInt(append(user[:0], 'u'), seq, 10)
		id = strconv.AppendInt(append(id[:0], "r-"...), seq, 10)
		rec, ok := tl.l.LookupRequest(user, id)
		if !ok {
			b.Fatalf("request %s of %s not found", id, user)
		}
		if _, found, err := tl.l.Order(rec.OrderID); !found || err != nil {
			b.Fatalf("order %s: %v %v", rec.OrderID, found, err)
		}
	}
}

// BenchmarkLedger_AuditOrders is the periodic audit's recount per order
// the ledger holds: the audit itself, beside a baseline that walks the
// same orders decoding each in full (as the audit did before it counted
// records in place).
func BenchmarkLedger_AuditOrders(b *testing.B) {
	const held = 200_000
	tl := newTestLedger(b)
	tl.applyTyped(0, &SetRules{Rules: RulesCurrent})
	fillRequests(b, tl, held)
	perOrder := func(b *testing.B) {
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*held), "ns/order")
	}
	b.Run("walk=decode", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			var sold int64
			err := tl.l.view(func(tx *bolt.Tx) error {
				return tx.Bucket(store.BucketOrders).ForEach(func(k, v []byte) error {
					return store.EachStoredOrder(k, v, func(o *stock.Order) error {
						if o.SKU == "s" && o.State == stock.OrderSold {
							sold += o.Qty
						}
						return nil
					})
				})
			})
			if err != nil || sold != held {
				b.Fatalf("sold %d, want %d: %v", sold, held, err)
			}
		}
		perOrder(b)
	})
	b.Run("walk=audit", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			if a := checkAudit(b, tl.l, "s"); a.OrdersSold != held {
				b.Fatalf("the audit counted %d sold, want %d", a.OrdersSold, held)
			}
		}
		perOrder(b)
	})
}

// BenchmarkLedger_GrowthAtRequestCap is the ledger's share of a batch
// deduct's unit as the ledger grows past its request-id cap: Takes of
// 1,000 new buyers, each with its own request id, a prune back to the
// default -request-max-keep whenever the ledger holds more ids (as the
// engine's janitor proposes), and the file written every 20 Takes on this
// goroutine. It reports the apply and the write per unit over the first
// and the last 500,000 orders of 6 million (STOCKD_BENCH_ORDERS
// overrides), the bytes the file's pages took per unit in each, and their
// ratio: a cost that grows with the ledger shows as a ratio above 1. Run
// it once: -benchtime 1x.
func BenchmarkLedger_GrowthAtRequestCap(b *testing.B) {
	const perTake, takesPerWrite, phase, capIDs = 1000, 20, 500_000, 1_000_000
	total := 6_000_000
	if n, err := strconv.Atoi(os.Getenv("STOCKD_BENCH_ORDERS")); err == nil && n >= 2*phase {
		total = n - n%phase
	}
	type phaseCost struct{ applyUs, writeUs, bytes float64 }
	measure := func() (first, last phaseCost) {
		tl := newTestLedger(b)
		tl.applyTyped(0, &SetRules{Rules: RulesScopedRequestIDs})
		tl.apply(legacyCommand{Op: OpCreateSale, SKU: "s", Sale: &SaleConfig{Total: int64(total) + 1}})
		tl.apply(legacyCommand{Op: OpLease, Node: "n1", SKU: "s", Qty: int64(total)})
		seq := uint64(1) << 40
		var applyT, writeT time.Duration
		var allocAt int64
		for done := 0; done < total; done += perTake {
			log := tl.benchTakeLog(&seq, perTake) // its time: its index
			t0 := time.Now()
			tl.l.ApplyBatch([]*raft.Log{log})
			if tl.l.RequestIDs() > capIDs {
				tl.applyTyped(int64(tl.index+1), &PruneRequests{MaxKeep: capIDs})
			}
			applyT += time.Since(t0)
			if (done/perTake)%takesPerWrite == takesPerWrite-1 {
				t0 = time.Now()
				if err := tl.l.Flush(); err != nil {
					b.Fatal(err)
				}
				writeT += time.Since(t0)
			}
			if (done+perTake)%phase == 0 {
				st := tl.l.db.Stats()
				alloc := st.TxStats.GetPageAlloc()
				c := phaseCost{applyT.Seconds() * 1e6 / phase, writeT.Seconds() * 1e6 / phase, float64(alloc-allocAt) / phase}
				switch done + perTake {
				case phase:
					first = c
				case total:
					last = c
				}
				applyT, writeT, allocAt = 0, 0, alloc
			}
		}
		checkAudit(b, tl.l, "s")
		return first, last
	}
	var first, last phaseCost
	for range b.N {
		first, last = measure()
	}
	b.ReportMetric(first.applyUs, "apply-µs/unit-first")
	b.ReportMetric(last.applyUs, "apply-µs/unit-last")
	b.ReportMetric(first.writeUs, "write-µs/unit-first")
	b.ReportMetric(last.writeUs, "write-µs/unit-last")
	b.ReportMetric(first.bytes, "page-B/unit-first")
	b.ReportMetric(last.bytes, "page-B/unit-last")
	b.ReportMetric((last.applyUs+last.writeUs)/(first.applyUs+first.writeUs), "last/first")
}
