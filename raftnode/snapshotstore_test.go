package raftnode

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"stockd.dev/stockd/raftfsm"
	"stockd.dev/stockd/raftfsm/command"
	"stockd.dev/stockd/stock"
)

// snapshotFiles lists the state files of the raft snapshots in dir.
func snapshotFiles(t *testing.T, dir string) map[string]int64 {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(dir, "snapshots", "*", "state.bin"))
	if err != nil {
		t.Fatal(err)
	}
	sizes := make(map[string]int64)
	for _, p := range paths {
		st, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		sizes[filepath.Base(filepath.Dir(p))] = st.Size()
	}
	return sizes
}

// sell proposes n single takes of sale "a" by node n1, each its own buyer.
func sell(t *testing.T, n *Node, from, count int) {
	t.Helper()
	for i := from; i < from+count; i++ {
		s := strconv.Itoa(i)
		r := mustPropose(t, n, &command.Take{Node: "n1", Entries: []command.TakeEntry{{SKU: "a", Qty: 1, User: "u" + s, RequestID: "r" + s, OrderID: "o" + s}}})
		if r.Takes[0].Outcome != stock.OutcomeOK {
			t.Fatalf("take %d: %s", i, r.Takes[0].Outcome)
		}
	}
}

// TestNode_SnapshotRefersToTheLedgerAndAFollowerGetsTheFile: the leader's
// snapshot is a reference of a few bytes, not a copy; a follower that
// joins after the log was compacted is sent the leader's ledger file as it
// is then (at a later index than the snapshot's), restores it, and skips
// the entries it already holds as raft sends them again.
func TestNode_SnapshotRefersToTheLedgerAndAFollowerGetsTheFile(t *testing.T) {
	dir1 := t.TempDir()
	l1, err := raftfsm.OpenLedger(dir1, nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.Dir, cfg.RaftBind, cfg.Logger = dir1, "127.0.0.1:0", testLogger(t)
	cfg.HeartbeatTimeout, cfg.ElectionTimeout, cfg.LeaderLeaseTimeout = 200*time.Millisecond, 200*time.Millisecond, 100*time.Millisecond
	// The log before the snapshot goes. raft-wal deletes whole segments
	// only (and still reads the entries of one it keeps); bolt deletes
	// exactly what raft compacts.
	cfg.TrailingLogs, cfg.LogStore = 4, LogStoreBolt
	n1, err := StartNode(cfg, l1)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { n1.Close(); l1.Close() }()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := n1.WaitLeader(ctx); err != nil {
		t.Fatal(err)
	}
	mustPropose(t, n1, &command.CreateSale{SKU: "a", Sale: stock.SaleConfig{Total: 1000}})
	mustPropose(t, n1, &command.Lease{Node: "n1", SKU: "a", Want: 1000})
	sell(t, n1, 0, 40)
	if err := n1.Snapshot(); err != nil {
		t.Fatal(err)
	}
	snapIndex := l1.AppliedIndex()
	// Sold after the snapshot: the file the follower gets holds these too.
	sell(t, n1, 40, 10)
	files := snapshotFiles(t, dir1)
	if len(files) != 1 {
		t.Fatalf("snapshots on the leader: %v, want one", files)
	}
	for id, size := range files {
		if size > 256 {
			t.Fatalf("the leader's snapshot %s is %d bytes: a copy, not a reference", id, size)
		}
	}
	var entry raft.Log
	if err := n1.logStore.GetLog(1, &entry); err == nil {
		t.Fatal("the leader's log still holds its first entry: the follower would not need a snapshot")
	}

	dir2 := t.TempDir()
	l2, err := raftfsm.OpenLedger(dir2, nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg2 := cfg
	cfg2.NodeID, cfg2.Dir, cfg2.NoBootstrap = "n2", dir2, true
	n2, err := StartNode(cfg2, l2)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { n2.Close(); l2.Close() }()
	want := l1.AppliedIndex()
	if err := n1.AddVoter("n2", string(n2.transport.LocalAddr())); err != nil {
		t.Fatal(err)
	}
	// Nothing is proposed until the follower has caught up: with two
	// voters a proposal waits for it, and raft's futures have no deadline.
	reach := func(want uint64) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); l2.AppliedIndex() < want; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("the follower reached index %d, the leader %d", l2.AppliedIndex(), want)
			}
		}
	}
	reach(want)
	sell(t, n1, 50, 5) // and it applies what comes after
	reach(l1.AppliedIndex())
	if l2.Restores() != 1 {
		t.Fatalf("the follower restored %d snapshots, want 1", l2.Restores())
	}
	got, _, _ := l2.SKU("a")
	have, _, _ := l1.SKU("a")
	if !reflect.DeepEqual(got, have) || got.Sold != 55 {
		t.Fatalf("the follower's row %+v, the leader's %+v, want 55 sold on both", got, have)
	}
	for _, o := range []string{"o0", "o45", "o54"} {
		if _, ok, _ := l2.Order(o); !ok {
			t.Fatalf("order %s missing on the follower", o)
		}
	}
	checkAudit(t, l1, "a")
	checkAudit(t, l2, "a")
	if snapIndex >= want {
		t.Fatalf("BUG in the test: the snapshot's index %d is not below the end %d", snapIndex, want)
	}
}

// TestNode_LedgerLostBehindAReferenceIsRefused: an operator deletes the
// ledger file but keeps raft's data. The newest snapshot only refers to
// the file, so nothing can rebuild it here: the node refuses to start,
// saying which file and what to do, rather than applying the log's tail
// to an empty ledger.
func TestNode_LedgerLostBehindAReferenceIsRefused(t *testing.T) {
	dir := t.TempDir()
	loseLedgerAfterASnapshot(t, dir, nil)
	l2, err := raftfsm.OpenLedger(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l2.Close()
	cfg := DefaultConfig()
	cfg.Dir, cfg.RaftBind, cfg.Logger = dir, "127.0.0.1:0", testLogger(t)
	n2, err := StartNode(cfg, l2)
	if err == nil {
		n2.Close()
		t.Fatal("a node whose ledger file is gone started")
	}
	if !errors.Is(err, raftfsm.ErrLedgerBehindSnapshot) || !strings.Contains(err.Error(), dir) || !strings.Contains(err.Error(), "-join") {
		t.Fatalf("the refusal: %v", err)
	}
}

// TestNode_LedgerLostIsRebuiltFromACopy: when the newest snapshot is a
// copy of a ledger (one a leader sent, or one an earlier version wrote),
// a node whose ledger file is gone rebuilds it from that copy at start.
func TestNode_LedgerLostIsRebuiltFromACopy(t *testing.T) {
	dir := t.TempDir()
	loseLedgerAfterASnapshot(t, dir, storeACopy)
	n3, l3 := startTestNode(t, dir)
	defer func() { n3.Close(); l3.Close() }()
	if s, _, ok := l3.SKU("a"); !ok || s.Total != 5 {
		t.Fatalf("sku after rebuild: %+v %v", s, ok)
	}
	checkAudit(t, l3, "a")
}

// loseLedgerAfterASnapshot runs a node on dir that creates sale "a" and
// takes a snapshot, then, once before (when not nil) has run, stops it
// and deletes its ledger file, as an operator might.
func loseLedgerAfterASnapshot(t *testing.T, dir string, before func(*testing.T, *Node, *raftfsm.Ledger)) {
	t.Helper()
	n, l := startTestNode(t, dir)
	mustPropose(t, n, &command.CreateSale{SKU: "a", Sale: stock.SaleConfig{Total: 5}})
	if err := n.Snapshot(); err != nil {
		t.Fatal(err)
	}
	if before != nil {
		before(t, n, l)
	}
	n.Close()
	l.Close()
	if err := os.Remove(filepath.Join(dir, "ledger.db")); err != nil {
		t.Fatal(err)
	}
}

// storeACopy stores a copy of l's file at the newest snapshot's index as
// a newer snapshot, as an earlier version would have written it.
func storeACopy(t *testing.T, n *Node, l *raftfsm.Ledger) {
	t.Helper()
	store, err := raft.NewFileSnapshotStore(n.cfg.Dir, snapshotsRetained, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	list, err := store.List()
	if err != nil || len(list) != 1 {
		t.Fatalf("snapshots: %v %v", list, err)
	}
	meta := list[0]
	stream, _, index, err := l.OpenStream()
	if err != nil {
		t.Fatal(err)
	}
	if index != meta.Index {
		t.Fatalf("the file is at %d, the snapshot at %d", index, meta.Index)
	}
	sink, err := store.Create(meta.Version, meta.Index, meta.Term, meta.Configuration, meta.ConfigurationIndex, n.transport)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(sink, stream); err != nil {
		t.Fatal(err)
	}
	stream.Close()
	if err := sink.Close(); err != nil {
		t.Fatal(err)
	}
}
