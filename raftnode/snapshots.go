package raftnode

import (
	"time"
)

// A follower that falls behind the start of the leader's raft log is sent
// the whole ledger (a snapshot, streamed from the leader's ledger file),
// while one that falls behind less catches up from the log. raft's
// trigger (SnapshotThreshold entries since the last snapshot, checked
// every SnapshotInterval) keeps the log short whatever the ledger's size:
// at ten million orders a follower down for a minute would be sent 2.4
// GB. The snapshot policy scales the threshold with the ledger instead: a
// snapshot comes once the log since the last one holds about a
// snapshotLogShare-th of the ledger's bytes, so a follower is sent the
// ledger only once it has missed about that share of it in log entries.
// (Before snapshots were references to the ledger file, the same policy
// bounded what snapshots wrote: each one was a copy of the ledger.) The
// price is a longer raft log on disk (at most about a quarter of the
// ledger file, plus TrailingLogs entries) and more of it to replay after
// a restart.
const snapshotLogShare = 4

// snapshotPolicyEvery is how often the policy looks at the ledger's size.
const snapshotPolicyEvery = 15 * time.Second

// snapshotThreshold is the SnapshotThreshold for a ledger of ledgerBytes
// whose log entries average meanEntryBytes: base, or the entries that
// make up a snapshotLogShare-th of the ledger if that is more.
func snapshotThreshold(base uint64, ledgerBytes int64, meanEntryBytes float64) uint64 {
	if ledgerBytes <= 0 || meanEntryBytes <= 0 {
		return base
	}
	n := uint64(float64(ledgerBytes) / snapshotLogShare / meanEntryBytes)
	return max(base, n)
}

// scaleSnapshots runs the snapshot policy until stop closes: every
// snapshotPolicyEvery it sets raft's SnapshotThreshold from the ledger
// file's size and the mean size of the entries logged so far.
func (n *Node) scaleSnapshots(stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	t := time.NewTicker(snapshotPolicyEvery)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		n.applySnapshotPolicy()
	}
}

// applySnapshotPolicy sets the threshold once, when it moved by a tenth
// or more.
func (n *Node) applySnapshotPolicy() {
	entries, bytes := n.logGuard.appended.Load(), n.logGuard.appendedBytes.Load()
	if entries == 0 {
		return
	}
	want := snapshotThreshold(n.cfg.SnapshotThreshold, n.ledger.FileBytes(), float64(bytes)/float64(entries))
	rc := n.raft.ReloadableConfig()
	if have := rc.SnapshotThreshold; want*10 < have*9 || want*10 > have*11 {
		rc.SnapshotThreshold = want
		if err := n.raft.ReloadConfig(rc); err != nil {
			n.logger.Warn("set the raft snapshot threshold", "entries", want, "err", err)
			return
		}
		n.logger.Info("raft snapshot threshold set from the ledger's size", "entries", want,
			"ledger_bytes", n.ledger.FileBytes(), "mean_entry_bytes", bytes/entries)
	}
}

// SnapshotThreshold is raft's current SnapshotThreshold (tests, metrics).
func (n *Node) SnapshotThreshold() uint64 { return n.raft.ReloadableConfig().SnapshotThreshold }
