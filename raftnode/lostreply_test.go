package raftnode

import (
	"context"
	"errors"
	"math"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"stockd.dev/stockd/raftfsm"
	"stockd.dev/stockd/raftfsm/command"
	"stockd.dev/stockd/stock"
)

// replyLost is a leader's transport to one follower that, while hold is
// set, fails every append carrying entries without sending it, and then
// loses the reply of the first append that brings the follower to index
// reach with every entry in it committed: the follower appended the
// entries, the leader never hears so. Before the reply is dropped, before
// runs with the append's last index.
type replyLost struct {
	raft.Transport
	to     raft.ServerID
	hold   atomic.Bool
	reach  atomic.Uint64
	before func(last uint64)
	lost   atomic.Bool
	sent   atomic.Int64 // entries in the append whose reply was lost
}

func (l *replyLost) AppendEntries(id raft.ServerID, target raft.ServerAddress, args *raft.AppendEntriesRequest, resp *raft.AppendEntriesResponse) error {
	if id != l.to || len(args.Entries) == 0 {
		return l.Transport.AppendEntries(id, target, args, resp)
	}
	if l.hold.Load() {
		return errors.New("the follower is held back")
	}
	err := l.Transport.AppendEntries(id, target, args, resp)
	last := args.Entries[len(args.Entries)-1].Index
	if err != nil || last < l.reach.Load() || args.LeaderCommitIndex < last || !l.lost.CompareAndSwap(false, true) {
		return err
	}
	l.sent.Store(int64(len(args.Entries)))
	l.before(last)
	return errors.New("the follower's reply was lost")
}

// plainTransport is a TCP network transport as the node builds one (no
// pipelining), without the cluster identity handshake.
func plainTransport(t *testing.T) *raft.NetworkTransport {
	t.Helper()
	layer, err := newTCPLayer("127.0.0.1:0", nil)
	if err != nil {
		t.Fatal(err)
	}
	nt := raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{Stream: layer, MaxPool: transportPoolConns, Timeout: 2 * time.Second, MaxRPCsInFlight: 1})
	t.Cleanup(func() { nt.Close() })
	return nt
}

// TestNode_FollowerThatSnapshotsAfterALostReplyCatchesUp: a follower
// appends a batch of entries, its reply is lost, and it takes a snapshot
// that keeps only TrailingLogs entries of its log before the leader sends
// the batch again. hashicorp/raft's follower refuses entries its log no
// longer holds, and the leader, which still held them, walked its next
// index back to 1 and sent them again for good, never a snapshot: the
// follower stayed behind until restarted (the nemesis found one stuck for
// minutes, with 16 trailing entries against 64 entries an append). An
// append now carries fewer entries than a follower keeps.
func TestNode_FollowerThatSnapshotsAfterALostReplyCatchesUp(t *testing.T) {
	const trailing = 16
	start := func(id string, tr raft.Transport, join bool) (*Node, *raftfsm.Ledger) {
		t.Helper()
		dir := t.TempDir()
		l, err := raftfsm.OpenLedger(dir, nil)
		if err != nil {
			t.Fatal(err)
		}
		cfg := DefaultConfig()
		cfg.NodeID, cfg.Dir, cfg.Logger, cfg.Transport, cfg.NoBootstrap = id, dir, testLogger(t), tr, join
		cfg.HeartbeatTimeout, cfg.ElectionTimeout, cfg.LeaderLeaseTimeout = 200*time.Millisecond, 200*time.Millisecond, 100*time.Millisecond
		cfg.TrailingLogs, cfg.LogStore = trailing, LogStoreBolt // bolt deletes exactly what raft compacts
		n, err := StartNode(cfg, l)
		if err != nil {
			l.Close()
			t.Fatal(err)
		}
		t.Cleanup(func() { n.Close(); l.Close() })
		return n, l
	}
	// The ledger's applied index, not raft's: raft counts an entry
	// applied when it hands it to the ledger.
	waitApplied := func(what string, l *raftfsm.Ledger, index uint64) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); l.AppliedIndex() < index; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s applied index %d, want %d", what, l.AppliedIndex(), index)
			}
		}
	}

	var n3 *Node
	var l3 *raftfsm.Ledger
	snapshotted := make(chan error, 1)
	lossy := &replyLost{Transport: plainTransport(t), to: "n3"}
	lossy.reach.Store(math.MaxUint64)
	lossy.before = func(last uint64) {
		// The follower applies what it appended, then snapshots and
		// compacts its log before the leader tries again.
		waitApplied("n3", l3, last)
		snapshotted <- n3.Snapshot()
	}
	n1, l1 := start("n1", lossy, false)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := n1.WaitLeader(ctx); err != nil {
		t.Fatal(err)
	}
	n2, _ := start("n2", plainTransport(t), true)
	if err := n1.AddVoter("n2", string(n2.transport.LocalAddr())); err != nil {
		t.Fatal(err)
	}
	mustPropose(t, n1, &command.CreateSale{SKU: "a", Sale: stock.SaleConfig{Total: 1000}})
	mustPropose(t, n1, &command.Lease{Node: "n1", SKU: "a", Want: 1000})
	sell(t, n1, 0, trailing)
	n3, l3 = start("n3", plainTransport(t), true)
	if err := n1.AddVoter("n3", string(n3.transport.LocalAddr())); err != nil {
		t.Fatal(err)
	}
	waitApplied("n3, joining,", l3, l1.AppliedIndex())

	// n3 falls 48 entries behind; the leader, whose log holds them all,
	// then sends them as appends, not a snapshot. The reply to the append
	// that brings n3 to the end of the log is lost.
	lossy.hold.Store(true)
	sell(t, n1, trailing, 3*trailing)
	lossy.reach.Store(n1.raft.LastIndex())
	lossy.hold.Store(false)
	select {
	case err := <-snapshotted:
		if err != nil {
			t.Fatalf("n3's snapshot after the lost reply: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no append to n3 carried entries in 10 s")
	}
	if first, err := n3.logStore.FirstIndex(); err != nil || first <= 1 {
		t.Fatalf("n3's log starts at %d (%v) after its snapshot: nothing was compacted, the test did not exercise it", first, err)
	}
	sell(t, n1, 4*trailing, 5)
	waitApplied("n3, after the lost reply and its snapshot,", l3, l1.AppliedIndex())
	if got := lossy.sent.Load(); got >= trailing {
		t.Fatalf("the append whose reply was lost carried %d entries; a follower keeps %d", got, trailing)
	}
	got, _, _ := l3.SKU("a")
	have, _, _ := l1.SKU("a")
	if got.Sold != have.Sold || have.Sold != 4*trailing+5 {
		t.Fatalf("n3 holds %d sold, the leader %d; want %d on both", got.Sold, have.Sold, 4*trailing+5)
	}
	checkAudit(t, l1, "a")
	checkAudit(t, l3, "a")
}
