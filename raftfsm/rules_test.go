package raftfsm

import (
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"stockd.dev/stockd/raftfsm/command"
	"stockd.dev/stockd/raftfsm/lottery"
	"stockd.dev/stockd/raftfsm/store"
	"stockd.dev/stockd/stock"
	"strings"
	"testing"
)

// readPrevious reads testdata/previous (previous_gen_test.go).
func readPrevious(t *testing.T) ([]previousEntry, []previousResult) {
	t.Helper()
	var log []previousEntry
	var results []previousResult
	for name, v := range map[string]any{"log.json": &log, "results.json": &results} {
		b, err := os.ReadFile(filepath.Join("testdata", "previous", name))
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(b, v); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	if len(log) != len(results) || len(log) == 0 {
		t.Fatalf("%d entries, %d results", len(log), len(results))
	}
	return log, results
}

// resultOf is r as previousResult records it.
func resultOf(r *command.Result) previousResult {
	out := previousResult{Outcome: r.Outcome.String()}
	for _, tr := range r.Takes {
		out.Takes = append(out.Takes, tr.Outcome.String()+" "+tr.Order.ID)
	}
	return out
}

// afterTheSwitch is what a ledger of the previous version applies once
// this version has switched it to scoped request ids, with the answers
// it must give.
var afterTheSwitch = []struct {
	entry TakeEntry
	want  string
}{
	// Recorded before the switch: the user's repeat still gets its order.
	{TakeEntry{SKU: "phone", Qty: 1, User: "alice", RequestID: "r-1", OrderID: "n1-20-a"}, "same n1-1-aa"},
	// Bob's r-1 is his own request now (before, he got alice's order).
	{TakeEntry{SKU: "tablet", Qty: 2, User: "bob", RequestID: "r-1", OrderID: "n1-21-b"}, "ok n1-21-b"},
	{TakeEntry{SKU: "tablet", Qty: 2, User: "bob", RequestID: "r-1", OrderID: "n1-22-c"}, "same n1-21-b"},
	// A recorded id reused for another SKU or qty changes nothing.
	{TakeEntry{SKU: "tablet", Qty: 1, User: "alice", RequestID: "r-2", OrderID: "n1-23-d"}, "request_id_reused "},
	{TakeEntry{SKU: "tablet", Qty: 2, User: "frank", RequestID: "r-5", OrderID: "n1-24-e"}, "request_id_reused "},
	{TakeEntry{SKU: "tablet", Qty: 1, User: "frank", RequestID: "r-5", OrderID: "n1-25-f"}, "same n1-8-hh"},
	// Another user's recorded id is a new request.
	{TakeEntry{SKU: "phone", Qty: 1, User: "zoe", RequestID: "r-4", OrderID: "n1-26-g"}, "ok n1-26-g"},
}

// applyAfterTheSwitch switches tl's ledger to scoped ids and applies
// afterTheSwitch, one Take each, checking every answer.
func applyAfterTheSwitch(t *testing.T, tl *testLedger) []previousResult {
	t.Helper()
	if r := tl.applyTyped(100, &SetRules{Rules: RulesScopedRequestIDs}); r.Outcome != stock.OutcomeOK {
		t.Fatalf("switch the rules: %s", r.Outcome)
	}
	var out []previousResult
	for i, step := range afterTheSwitch {
		r := tl.applyTyped(int64(101+i), &Take{Node: "n1", Entries: []TakeEntry{step.entry}})
		got := resultOf(r)
		if got.Takes[0] != step.want {
			t.Fatalf("after the switch, %s's %s for %d %s: %q, want %q", step.entry.User, step.entry.RequestID, step.entry.Qty, step.entry.SKU, got.Takes[0], step.want)
		}
		out = append(out, got)
	}
	for _, sku := range []string{"phone", "tablet"} {
		checkAudit(t, tl.l, sku)
	}
	return out
}

// TestPrevious_LedgerReplaysTheSame: the log the version before scoped
// request ids wrote replays with the results it gave (its ledger knew no
// rules: request ids stay global until the log switches them); the file
// it wrote opens, and after the switch the ids it recorded still answer
// their own users' repeats, refuse reuse for another SKU or qty, and are
// new requests for other users; the replayed ledger and the opened file
// answer alike and end equal.
func TestPrevious_LedgerReplaysTheSame(t *testing.T) {
	log, want := readPrevious(t)
	replayed := newTestLedger(t)
	for i, entry := range log {
		at, c, err := DecodeCommand(entry.Data)
		if err != nil {
			t.Fatalf("entry %d: %v", i, err)
		}
		if got := resultOf(replayed.applyTyped(at, c)); !reflect.DeepEqual(got, want[i]) {
			t.Fatalf("entry %d (%s) replays as %+v; the previous version answered %+v", i, c.Op(), got, want[i])
		}
	}
	if replayed.l.Rules() != RulesGlobalRequestIDs {
		t.Fatalf("a log without SetRules left rules %d", replayed.l.Rules())
	}

	// The file the previous version wrote, opened by this one.
	opened := &testLedger{tb: t, dir: t.TempDir()}
	copyFile(t, filepath.Join("testdata", "previous", store.FileName), filepath.Join(opened.dir, store.FileName))
	l, err := OpenLedger(opened.dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	opened.l, opened.index = l, l.AppliedIndex()
	if opened.index != uint64(len(log)) || l.Rules() != RulesGlobalRequestIDs {
		t.Fatalf("the previous version's file opens at index %d with rules %d, want %d and 0", opened.index, l.Rules(), len(log))
	}
	a := applyAfterTheSwitch(t, replayed)
	b := applyAfterTheSwitch(t, opened)
	if !reflect.DeepEqual(a, b) {
		t.Fatalf("after the switch the replayed ledger answers %v, the opened file %v", a, b)
	}
	for _, sku := range []string{"phone", "tablet"} {
		ra, rb := checkAudit(t, replayed.l, sku), checkAudit(t, opened.l, sku)
		if ra.Row.Sold != rb.Row.Sold || ra.Row.Held != rb.Row.Held || ra.Orders != rb.Orders {
			t.Fatalf("sku %s: replayed %+v, opened %+v", sku, ra.Row, rb.Row)
		}
	}
	// The rules stay across a reopen and a snapshot.
	if l := opened.reopen(); l.Rules() != RulesScopedRequestIDs {
		t.Fatalf("rules %d after a reopen", l.Rules())
	}
	dst := newTestLedger(t)
	if err := dst.l.Restore(io.NopCloser(snapshotOf(t, opened.l))); err != nil {
		t.Fatal(err)
	}
	if dst.l.Rules() != RulesScopedRequestIDs {
		t.Fatalf("rules %d after a restore", dst.l.Rules())
	}
	if id, ok := dst.l.OrderIDForRequest("alice", "r-1"); !ok || id != "n1-1-aa" {
		t.Fatalf("alice's r-1 after a restore: %q %v", id, ok)
	}
	if _, ok := dst.l.OrderIDForRequest("bob", "r-2"); ok {
		t.Fatal("bob's r-2 answers alice's order after a restore")
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestRules_NewerThanTheBinaryStopTheNode: a SetRules this binary does not
// know stops the node before it applies anything under them.
func TestRules_NewerThanTheBinaryStopTheNode(t *testing.T) {
	tl := newTestLedger(t)
	defer func() {
		r := recover()
		if r == nil || !strings.Contains(r.(string), "newer than this binary's") {
			t.Fatalf("rules %d applied: %v", RulesCurrent+1, r)
		}
	}()
	tl.applyTyped(1, &SetRules{Rules: RulesCurrent + 1})
}

// TestRules_ScopedEntriesShareTheUsersIDs: under scoped ids a lottery
// entry and a take of one user cannot share an id, in either order and
// within one command; another user's id is theirs; an archive forgets
// the ids of its orders and entries.
func TestRules_ScopedEntriesShareTheUsersIDs(t *testing.T) {
	tl := newTestLedger(t)
	tl.applyTyped(1, &SetRules{Rules: RulesCurrent})
	tl.applyTyped(1, &CreateSale{SKU: "a", Sale: SaleConfig{Total: 10}})
	tl.applyTyped(1, &CreateSale{SKU: "L", Sale: SaleConfig{Total: 2, Mode: SaleModeLottery, EntriesCloseAtUnixNano: 50},
		Secret: make([]byte, lottery.SecretBytes)})
	tl.applyTyped(1, &Lease{Node: "n1", SKU: "a", Want: 10})
	take := func(user, req, order string) stock.Outcome {
		t.Helper()
		return tl.applyTyped(2, &Take{Node: "n1", Entries: []TakeEntry{{SKU: "a", Qty: 1, User: user, RequestID: req, OrderID: order}}}).Takes[0].Outcome
	}
	enter := func(entries ...EnterEntry) []stock.Outcome {
		t.Helper()
		var out []stock.Outcome
		for _, r := range tl.applyTyped(3, &Enter{Entries: entries}).Entries {
			out = append(out, r.Outcome)
		}
		return out
	}
	if o := take("u1", "x", "o1"); o != stock.OutcomeOK {
		t.Fatalf("take: %s", o)
	}
	got := enter(EnterEntry{SKU: "L", User: "u1", RequestID: "x"}, EnterEntry{SKU: "L", User: "u2", RequestID: "x"},
		EnterEntry{SKU: "L", User: "u3", RequestID: "y"}, EnterEntry{SKU: "L", User: "u3", RequestID: "z"})
	if want := []stock.Outcome{stock.OutcomeRequestIDReused, stock.OutcomeOK, stock.OutcomeOK, stock.OutcomeSame}; !reflect.DeepEqual(got, want) {
		t.Fatalf("entries: %v, want %v", got, want)
	}
	if o := take("u3", "y", "o2"); o != stock.OutcomeRequestIDReused {
		t.Fatalf("take with an entry's id: %s", o)
	}
	if o := take("u3", "z", "o3"); o != stock.OutcomeOK {
		t.Fatalf("take with an id the entry did not keep: %s", o)
	}
	if rec, ok := tl.l.LookupRequest([]byte("u2"), []byte("x")); !ok || rec.EntrySKU != "L" {
		t.Fatalf("u2's x: %+v %v", rec, ok)
	}
	checkAudit(t, tl.l, "a")

	// An archive of both sales forgets every id they held.
	before := tl.l.RequestIDs()
	for _, sku := range []string{"a", "L"} {
		tl.applyTyped(60, &CloseSale{SKU: sku})
		if r := tl.applyTyped(60, &ArchiveSale{SKU: sku}); r.Outcome != stock.OutcomeOK {
			t.Fatalf("archive %s: %s %s", sku, r.Outcome, r.Detail)
		}
		var after []byte
		for r := purgeOneStep(t, tl, 60, sku, 100, &after); r.Detail != "done"; r = purgeOneStep(t, tl, 60, sku, 100, &after) {
			if r.Outcome != stock.OutcomeOK {
				t.Fatalf("purge %s: %s", sku, r.Outcome)
			}
		}
	}
	if n := tl.l.RequestIDs(); before != 4 || n != 0 {
		t.Fatalf("request ids %d before the archives (want 4), %d after (want 0)", before, n)
	}
	if o := take("u1", "x", "o9"); o != stock.OutcomeClosed {
		t.Fatalf("take after the archive: %s", o)
	}
}
