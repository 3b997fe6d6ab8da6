package raftnode

import (
	"fmt"
	"io"
	"log/slog"
	"stockd.dev/stockd/raftfsm/store"

	"github.com/hashicorp/raft"

	"stockd.dev/stockd/raftfsm"
)

// ledgerSnapshots is raft's file snapshot store for a node whose snapshots
// refer to its ledger file (store.SnapshotRef) instead of copying it.
// Open of such a snapshot, which raft does to send it to a follower,
// streams the ledger file as it is now: a consistent copy at the
// snapshot's index or later, which the follower restores and whose
// entries after the snapshot's index its apply then skips. A snapshot
// that is a copy (one a leader sent this node, or one an earlier version
// wrote) opens as it is. raft may call it from its replication and FSM
// goroutines at once.
type ledgerSnapshots struct {
	*raft.FileSnapshotStore
	ledger *raftfsm.Ledger
	logger *slog.Logger
}

var _ raft.SnapshotStore = (*ledgerSnapshots)(nil)

// Open opens snapshot id: a copy as it is stored, a reference as the
// ledger file's stream.
func (s *ledgerSnapshots) Open(id string) (*raft.SnapshotMeta, io.ReadCloser, error) {
	meta, ref, copied, err := openStored(s.FileSnapshotStore, id)
	if err != nil || ref == nil {
		return meta, copied, err
	}
	stream, size, index, err := s.ledger.OpenStream()
	if err != nil {
		return nil, nil, fmt.Errorf("open the ledger file for snapshot %s: %w", id, err)
	}
	if index < ref.AppliedIndex {
		stream.Close()
		return nil, nil, fmt.Errorf("BUG: snapshot %s refers to the ledger file at index %d, which holds %d", id, ref.AppliedIndex, index)
	}
	s.logger.Info("sending the ledger file for a snapshot", "snapshot", id, "snapshot_index", ref.AppliedIndex, "ledger_index", index, "bytes", size)
	m := *meta
	m.Size = size
	return &m, stream, nil
}

type readCloser struct {
	io.Reader
	io.Closer
}

// openStored opens snapshot id as stored: a reference comes back as ref,
// a copy as copied, which the caller closes.
func openStored(files *raft.FileSnapshotStore, id string) (meta *raft.SnapshotMeta, ref *store.SnapshotRef, copied io.ReadCloser, err error) {
	meta, rc, err := files.Open(id)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("open snapshot %s: %w", id, err)
	}
	ref, rest, err := store.ReadSnapshotRef(rc)
	switch {
	case err != nil:
		rc.Close()
		return nil, nil, nil, fmt.Errorf("open snapshot %s: %w", id, err)
	case ref != nil:
		rc.Close()
		return meta, ref, nil, nil
	}
	return meta, nil, readCloser{Reader: rest, Closer: rc}, nil
}

// catchUpFromSnapshot restores the ledger from the newest snapshot when the
// ledger file is older than it and the snapshot is a copy (one a leader
// sent): raft will not restore at start, and the log before the snapshot
// may be gone. When the newest snapshot refers to the ledger file, the
// file was lost or replaced by an older one, and nothing here can rebuild
// it: the node refuses to start and says how to go on.
func catchUpFromSnapshot(ledger *raftfsm.Ledger, snaps *raft.FileSnapshotStore, dir string, logger *slog.Logger) error {
	list, err := snaps.List()
	if err != nil {
		return fmt.Errorf("list snapshots: %w", err)
	}
	if len(list) == 0 || list[0].Index <= ledger.AppliedIndex() {
		return nil
	}
	_, ref, copied, err := openStored(snaps, list[0].ID)
	if err != nil {
		return err
	}
	if ref != nil {
		return fmt.Errorf("%w: the ledger file in %s holds index %d, the raft snapshot %s says it held %d: it was lost or replaced by an older copy. "+
			"In a cluster, remove the node (DELETE /v1/cluster/nodes/{id} on another member), empty its data dir and start it with -join (the leader sends it the ledger); alone, rebuild the data dir from a backup with stockd restore",
			raftfsm.ErrLedgerBehindSnapshot, dir, ledger.AppliedIndex(), list[0].ID, ref.AppliedIndex)
	}
	logger.Warn("ledger is behind the newest snapshot; restoring it",
		"ledger_index", ledger.AppliedIndex(), "snapshot_index", list[0].Index)
	return ledger.Restore(copied)
}
