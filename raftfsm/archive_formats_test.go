package raftfsm

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"maps"
	"slices"
	"stockd.dev/stockd/raftfsm/command"
	"stockd.dev/stockd/raftfsm/store"
	"stockd.dev/stockd/stock"
	"strconv"
	"testing"

	bolt "go.etcd.io/bbolt"
)

// TestArchive_NodesOfTwoFileFormatsPurgeAlike: two nodes apply the same
// log, but one's file stores orders as the version before format 3 wrote
// them (a record each, format 2) and the other's in blocks. Both archive
// the same two sales (one with per-user counts and request ids), in steps
// the leader's file picks, with a leader change half way: they end with
// the same orders, request ids, counts, rows and feed. Under the earlier
// rules, PurgeArchived steps (which walk the file) leave them apart: what
// the new command is for.
func TestArchive_NodesOfTwoFileFormatsPurgeAlike(t *testing.T) {
	older, blocks := newTestLedger(t), newTestLedger(t)
	both := func(at int64, c Command) {
		t.Helper()
		ro, rb := older.applyTyped(at, c), blocks.applyTyped(at, c)
		if ro.Outcome != rb.Outcome || ro.Qty != rb.Qty || ro.Detail != rb.Detail {
			t.Fatalf("%s: the nodes answer %s %d %q and %s %d %q", c.Op(), ro.Outcome, ro.Qty, ro.Detail, rb.Outcome, rb.Qty, rb.Detail)
		}
	}
	both(0, &SetRules{Rules: RulesNamedPurges})
	sellAndArchive(t, both)
	explodeBlocks(t, older)
	if b, _ := orderKeys(t, older.l); b != 0 {
		t.Fatalf("the older file holds %d blocks", b)
	}
	if b, _ := orderKeys(t, blocks.l); b < 4 {
		t.Fatalf("the newer file holds %d blocks", b)
	}

	// The purge, as the leader's purger runs it but in small steps: older
	// leads for four steps, then blocks takes over from the start of its
	// own file.
	leader, after, steps := older, []byte(nil), 0
	for _, sku := range []string{"a", "p"} {
		for !leader.row(sku).PurgeDone {
			if steps++; steps > 500 {
				t.Fatalf("the purge of %s does not end", sku)
			}
			if steps == 5 {
				leader, after = blocks, nil
			}
			ids, next, done, err := leader.l.ArchivedOrderIDs(sku, after, 30, 70)
			if err != nil {
				t.Fatal(err)
			}
			step := &PurgeOrders{SKU: sku, IDs: ids, OrdersDone: done}
			if done {
				step.Entries = 100
			}
			both(0, step)
			after = next
			if done {
				after = nil
			}
		}
	}
	ao, ab := logicalLedger(t, older.l), logicalLedger(t, blocks.l)
	if !maps.Equal(ao, ab) {
		for k := range ao {
			if ao[k] != ab[k] {
				t.Errorf("%q: older %x, blocks %x", k, ao[k], ab[k])
			}
		}
		for k := range ab {
			if _, ok := ao[k]; !ok {
				t.Errorf("%q only in blocks", k)
			}
		}
		t.FailNow()
	}
	for _, l := range []*Ledger{older.l, blocks.l} {
		for _, sku := range []string{"a", "b", "p"} {
			checkAudit(t, l, sku)
		}
		if n := len(saleOrderIDs(t, l, "a", "")) + len(saleOrderIDs(t, l, "p", "")); n != 0 {
			t.Fatalf("%d orders of the archived sales left", n)
		}
		if got := len(saleOrderIDs(t, l, "b", "")); got != 600 {
			t.Fatalf("sale b keeps %d orders, want 600", got)
		}
		if row := rowOf(t, l, "a"); row.Sold < 400 || row.ArchivedOrders != row.Sold || row.ArchivedSold != row.Sold {
			t.Fatalf("archived a: %+v", row)
		}
	}
	// A step proposed twice changes nothing; the old command is refused.
	both(0, &PurgeOrders{SKU: "a", IDs: []string{"n1-1-r1"}, OrdersDone: true})
	if r := blocks.applyTyped(0, &PurgeArchived{SKU: "b", Scan: 10}); r.Outcome != stock.OutcomeInvalid {
		t.Fatalf("purge_archived under rules %d: %s", RulesNamedPurges, r.Outcome)
	}
}

// TestArchive_FileWalkingStepsDisagreeAcrossFormats shows why the rules
// changed: the same PurgeArchived steps on the two files stop at
// different places.
func TestArchive_FileWalkingStepsDisagreeAcrossFormats(t *testing.T) {
	older, blocks := newTestLedger(t), newTestLedger(t)
	both := func(at int64, c Command) {
		t.Helper()
		older.applyTyped(at, c)
		blocks.applyTyped(at, c)
	}
	sellAndArchive(t, both)
	explodeBlocks(t, older)
	both(0, &PurgeArchived{SKU: "a", Scan: 100})
	if o, b := older.row("a"), blocks.row("a"); o.ArchivedOrders == b.ArchivedOrders && o.PurgeAfter == b.PurgeAfter {
		t.Fatalf("file-walking steps agreed across formats (%d orders, after %q): the test no longer shows the problem", o.ArchivedOrders, o.PurgeAfter)
	}
}

// sellAndArchive sells sales a (per_user, request ids), b and p (held
// then confirmed orders, which keep records of their own) through two
// nodes' orders in blocks, then archives a and p.
func sellAndArchive(t *testing.T, apply func(at int64, c Command)) {
	t.Helper()
	apply(0, &CreateSale{SKU: "a", Sale: SaleConfig{Total: 1000, PerUser: 5}})
	apply(0, &CreateSale{SKU: "b", Sale: SaleConfig{Total: 1000}})
	apply(0, &CreateSale{SKU: "p", Sale: SaleConfig{Total: 100, HoldTTLNanos: 1 << 40}})
	for _, n := range []string{"n1", "n2"} {
		for _, sku := range []string{"a", "b"} {
			apply(0, &Lease{Node: n, SKU: sku, Want: 400})
		}
	}
	apply(0, &Lease{Node: "n1", SKU: "p", Want: 50})
	at := int64(10)
	for seq := uint64(1); seq <= 600; seq += 20 {
		for _, n := range []string{"n1", "n2"} {
			var entries []TakeEntry
			for s := seq; s < seq+20; s++ {
				sku := []string{"a", "b"}[s%2]
				id := n + "-" + strconv.FormatUint(s, 36) + "-r" + strconv.FormatUint(s*7919%1000, 36)
				entries = append(entries, TakeEntry{SKU: sku, Qty: 1, User: fmt.Sprintf("u%d", s%97), RequestID: "q-" + id, OrderID: id})
			}
			at += 10
			apply(at, &Take{Node: n, Entries: entries})
		}
	}
	for i := range 20 {
		id := "n1-" + strconv.FormatUint(uint64(2000+i), 36) + "-h"
		at += 10
		apply(at, &Take{Node: "n1", Entries: []TakeEntry{{SKU: "p", Qty: 1, User: "h" + strconv.Itoa(i), RequestID: "h" + strconv.Itoa(i), OrderID: id}}})
		if i%2 == 0 {
			apply(at, &Confirm{OrderID: id})
		} else {
			apply(at, &Release{OrderID: id, Reason: stock.ReleaseCancelled})
		}
	}
	for _, sku := range []string{"a", "p"} {
		apply(at, &CloseSale{SKU: sku})
		apply(at, &ArchiveSale{SKU: sku})
	}
}

// explodeBlocks rewrites tl's file as the version before format 3 wrote
// it: every order in a record of its own, format 2.
func explodeBlocks(t *testing.T, tl *testLedger) {
	t.Helper()
	tl.rewriteFile(func(tx *bolt.Tx) error {
		bucket := tx.Bucket(store.BucketOrders)
		type record struct{ id, v []byte }
		var records []record
		var doomed [][]byte
		err := bucket.ForEach(func(k, v []byte) error {
			if !store.IsOrderBlockKey(k) {
				return nil
			}
			doomed = append(doomed, bytes.Clone(k))
			b, err := store.ParseOrderBlock(k, v)
			if err != nil {
				return err
			}
			return b.Each(func(_ int, m *store.BlockMember) bool {
				records = append(records, record{b.AppendID(nil, m), bytes.Clone(m.Record)})
				return true
			})
		})
		if err != nil {
			return err
		}
		for _, k := range doomed {
			if err := bucket.Delete(k); err != nil {
				return err
			}
		}
		for _, r := range records {
			if err := bucket.Put(r.id, r.v); err != nil {
				return err
			}
		}
		return tx.Bucket(store.BucketMeta).Put(store.KeyFormat, binary.BigEndian.AppendUint32(nil, 2))
	})
}

// logicalLedger is a ledger's file as the state it holds: every bucket's
// records, but the orders by id wherever the file keeps them, and
// without the file's format.
func logicalLedger(t *testing.T, l *Ledger) map[string]string {
	t.Helper()
	if err := l.Flush(); err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	err := l.view(func(tx *bolt.Tx) error {
		return tx.ForEach(func(name []byte, bucket *bolt.Bucket) error {
			return bucket.ForEach(func(k, v []byte) error {
				switch {
				case bytes.Equal(name, store.BucketMeta) && (bytes.Equal(k, store.KeyFormat) || bytes.Equal(k, store.KeyFeedSeq)),
					bytes.Equal(name, store.BucketEvents):
					// The format differs by design; the feed's events
					// reach the file on their own schedule (compared
					// through ReadFeed below).
				case bytes.Equal(name, store.BucketOrders) && store.IsOrderBlockKey(k):
					b, err := store.ParseOrderBlock(k, v)
					if err != nil {
						return err
					}
					return b.Each(func(_ int, m *store.BlockMember) bool {
						out["orders/"+string(b.AppendID(nil, m))] = string(m.Record)
						return true
					})
				default:
					out[string(name)+"/"+string(k)] = string(v)
				}
				return nil
			})
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(out) < 300 {
		t.Fatalf("the ledger holds %d records", len(out))
	}
	var feed feedTally
	feed.readAll(t, l)
	for _, e := range feed.events {
		out[fmt.Sprintf("feed/%d", e.Seq)] = fmt.Sprintf("%+v", e)
	}
	if len(feed.events) < 600 {
		t.Fatalf("the feed holds %d events", len(feed.events))
	}
	return out
}

func rowOf(t *testing.T, l *Ledger, sku string) stock.SKU {
	t.Helper()
	row, _, ok := l.SKU(sku)
	if !ok {
		t.Fatalf("no sale %s", sku)
	}
	return row
}

// purgeOneStep applies the next step of sku's purge with the command the
// ledger's rules take, reading at most scan records: a PurgeArchived
// under earlier rules, else a PurgeOrders of the ids the file holds after
// *after (which it moves on, as the leader's purger does).
func purgeOneStep(t fataler, tl *testLedger, at int64, sku string, scan int64, after *[]byte) *command.Result {
	t.Helper()
	if tl.l.Rules() < RulesNamedPurges {
		row, _, _ := tl.l.SKU(sku)
		return tl.applyTyped(at, &PurgeArchived{SKU: sku, After: row.PurgeAfter, Scan: scan})
	}
	ids, next, done, err := tl.l.ArchivedOrderIDs(sku, *after, int(scan), int(scan))
	if err != nil {
		t.Fatalf("ids of %s to purge: %v", sku, err)
	}
	*after = next
	step := &PurgeOrders{SKU: sku, IDs: ids, OrdersDone: done}
	if done {
		step.Entries = scan
	}
	return tl.applyTyped(at, step)
}

// TestArchive_StepsNeverNameMoreThanTheLimit: a leader's read for a step
// stops before a block that would take it past the limit (the step would
// be refused), and the next read starts with that block.
func TestArchive_StepsNeverNameMoreThanTheLimit(t *testing.T) {
	tl := newTestLedger(t)
	tl.applyTyped(0, &SetRules{Rules: RulesNamedPurges})
	sellAndArchive(t, func(at int64, c Command) { tl.applyTyped(at, c) })
	var after []byte
	seen := map[string]bool{}
	for reads := 0; ; reads++ {
		if reads > 100 {
			t.Fatal("the reads do not end")
		}
		ids, next, done, err := tl.l.ArchivedOrderIDs("a", after, 400, 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		if len(ids) > 400 {
			t.Fatalf("a read of at most 400 ids gave %d", len(ids))
		}
		for _, id := range ids {
			if seen[id] {
				t.Fatalf("%s read twice", id)
			}
			seen[id] = true
		}
		if after = next; done {
			break
		}
	}
	if row := tl.row("a"); int64(len(seen)) != row.Sold {
		t.Fatalf("the reads gave %d ids of a's %d orders", len(seen), row.Sold)
	}
}

// TestArchive_PurgeStepsTravelCompactly: a step's engine-shaped ids
// travel as their node, a sequence delta and a number (the raft log and
// its cache hold the encoded step); others whole; all come back.
func TestArchive_PurgeStepsTravelCompactly(t *testing.T) {
	var ids []string
	for i := range 1000 {
		ids = append(ids, fmt.Sprintf("n%d-%s-%s", i%3, strconv.FormatUint(uint64(1_500_000_000_000_000+i*7), 36), strconv.FormatUint(uint64(i)*0x9e3779b97f4a7c15, 36)))
	}
	odd := []string{"o-1", "n1-0a-x", "n2-big-0", "n2-big-1", "n1-5-AB", "lottery:L:1"}
	step := &PurgeOrders{SKU: "a", IDs: append(slices.Clone(ids), odd...), Entries: 7, OrdersDone: true}
	b := EncodeCommand(nil, 1, step)
	if per := float64(len(b)) / float64(len(step.IDs)); per > 14 {
		t.Fatalf("%d bytes for %d ids: %.1f an id", len(b), len(step.IDs), per)
	}
	_, c, err := DecodeCommand(b)
	if err != nil {
		t.Fatal(err)
	}
	got := c.(*PurgeOrders)
	if !slices.Equal(slices.Sorted(slices.Values(got.IDs)), slices.Sorted(slices.Values(step.IDs))) || got.SKU != "a" || got.Entries != 7 || !got.OrdersDone {
		t.Fatalf("the step came back as %+v", got)
	}
}
