package raftfsm

import (
	"encoding/json"
	"os"
	"path/filepath"
	"stockd.dev/stockd/raftfsm/store"
	"testing"

	bolt "go.etcd.io/bbolt"
)

// This file writes testdata/previous: a log of commands, the results the
// ledger of the version before scoped request ids gave them, and the
// ledger file that version wrote. It uses only what that version has, so
// it runs on its commit (copied into a worktree of it):
//
//	git worktree add /tmp/prev aa92d03
//	cp raftfsm/previous_gen_test.go /tmp/prev/raftfsm/
//	(cd /tmp/prev && STOCKD_WRITE_PREVIOUS=$PWD/../main/raftfsm/testdata/previous \
//	    go test -count=1 -run TestPrevious_Write ./raftfsm/)
//
// TestPrevious_LedgerReplaysTheSame (rules_test.go) reads it.

// previousEntry is one log entry of the previous version's log.
type previousEntry struct {
	At   int64  `json:"at"`
	Data []byte `json:"data"` // EncodeCommand bytes
}

// previousResult is what the previous version answered one entry.
type previousResult struct {
	Outcome string   `json:"outcome"`
	Takes   []string `json:"takes,omitempty"` // "<outcome> <order id>" per entry
}

// previousLog is the previous version's sale: request ids shared by two
// users and reused for another SKU, repeats, holds, a confirm.
func previousLog() []previousEntry {
	var out []previousEntry
	add := func(at int64, c Command) { out = append(out, previousEntry{At: at, Data: EncodeCommand(nil, at, c)}) }
	take := func(at int64, entries ...TakeEntry) { add(at, &Take{Node: "n1", Entries: entries}) }
	e := func(sku, user, req, order string, qty int64) TakeEntry {
		return TakeEntry{SKU: sku, Qty: qty, User: user, RequestID: req, OrderID: order}
	}
	add(1, &CreateSale{SKU: "phone", Sale: SaleConfig{Total: 20}})
	add(1, &CreateSale{SKU: "tablet", Sale: SaleConfig{Total: 20, HoldTTLNanos: 1000}})
	add(2, &Lease{Node: "n1", SKU: "phone", Want: 20})
	add(2, &Lease{Node: "n1", SKU: "tablet", Want: 20})
	take(10, e("phone", "alice", "r-1", "n1-1-aa", 1))
	take(11, e("tablet", "bob", "r-1", "n1-2-bb", 2)) // the previous version: alice's phone order
	take(12, e("phone", "alice", "r-2", "n1-3-cc", 1), e("tablet", "carol", "r-3", "n1-4-dd", 1), e("phone", "dave", "r-4", "n1-5-ee", 2))
	take(13, e("tablet", "alice", "r-2", "n1-6-ff", 1)) // alice's r-2 again, another SKU: her phone order
	take(14, e("phone", "erin", "", "n1-7-gg", 1))
	add(15, &Confirm{OrderID: "n1-4-dd"})
	take(16, e("tablet", "frank", "r-5", "n1-8-hh", 1))
	take(17, e("phone", "alice", "r-1", "n1-9-ii", 1)) // alice's repeat
	return out
}

func TestPrevious_Write(t *testing.T) {
	dir := os.Getenv("STOCKD_WRITE_PREVIOUS")
	if dir == "" {
		t.Skip("writes the previous version's ledger for TestPrevious_LedgerReplaysTheSame: set STOCKD_WRITE_PREVIOUS=DIR")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	tl := newTestLedger(t)
	log := previousLog()
	results := make([]previousResult, len(log))
	for i, entry := range log {
		at, c, err := DecodeCommand(entry.Data)
		if err != nil {
			t.Fatal(err)
		}
		r := tl.applyTyped(at, c)
		results[i].Outcome = r.Outcome.String()
		for _, tr := range r.Takes {
			results[i].Takes = append(results[i].Takes, tr.Outcome.String()+" "+tr.Order.ID)
		}
	}
	if err := tl.l.Close(); err != nil {
		t.Fatal(err)
	}
	for name, v := range map[string]any{"log.json": log, "results.json": results} {
		b, err := json.MarshalIndent(v, "", " ")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), append(b, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// The file's buckets, keys and values as that version wrote them,
	// compacted: the ledger's file is 16 MiB of preallocated pages.
	src, err := bolt.Open(filepath.Join(tl.dir, store.FileName), 0o600, &bolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	dst, err := bolt.Open(filepath.Join(dir, store.FileName), 0o644, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := bolt.Compact(dst, src, 0); err != nil {
		t.Fatal(err)
	}
	if err := dst.Close(); err != nil {
		t.Fatal(err)
	}
}
