package raftnode

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"stockd.dev/stockd/raftfsm/store"

	"github.com/hashicorp/raft"

	"stockd.dev/stockd/raftfsm"
)

// startRestored starts the new cluster of a data dir `stockd restore`
// built: raft gets a snapshot of the restored ledger at its index, whose
// configuration names the new cluster's voters (the marker's, else
// -peers, else this node alone at its raft address), so the log goes on
// after it. The
// marker is removed once the snapshot is in place; a marker left beside
// raft state (a crash in between) is only removed.
func startRestored(cfg *Config, ledger *raftfsm.Ledger, logs raft.LogStore, stable raft.StableStore, snaps raft.SnapshotStore, transport raft.Transport, logger *slog.Logger) error {
	m, ok, err := store.ReadRestoreMarker(cfg.Dir)
	if err != nil || !ok {
		return err
	}
	if m.NodeID != cfg.NodeID {
		return fmt.Errorf("the data dir %s was restored for node %q: serve it with -id %s", cfg.Dir, m.NodeID, m.NodeID)
	}
	existing, err := raft.HasExistingState(logs, stable, snaps)
	if err != nil {
		return fmt.Errorf("inspect raft state in %s: %w", cfg.Dir, err)
	}
	if !existing {
		if got := ledger.AppliedIndex(); got != m.Index {
			return fmt.Errorf("the restored ledger in %s is at index %d, its restore marker says %d", cfg.Dir, got, m.Index)
		}
		servers := []raft.Server{{ID: raft.ServerID(cfg.NodeID), Address: transport.LocalAddr()}}
		switch {
		case len(m.Peers) > 0:
			servers = servers[:0]
			for _, p := range m.Peers {
				servers = append(servers, raft.Server{ID: raft.ServerID(p.ID), Address: raft.ServerAddress(p.Addr)})
			}
		case len(cfg.Peers) > 0:
			servers = servers[:0]
			for _, p := range cfg.Peers {
				servers = append(servers, raft.Server{ID: raft.ServerID(p.ID), Address: raft.ServerAddress(p.Addr)})
			}
		}
		snap, err := ledger.Snapshot()
		if err != nil {
			return fmt.Errorf("snapshot the restored ledger: %w", err)
		}
		sink, err := snaps.Create(raft.SnapshotVersionMax, m.Index, 1, raft.Configuration{Servers: servers}, m.Index, transport)
		if err != nil {
			snap.Release()
			return fmt.Errorf("create the restored cluster's snapshot: %w", err)
		}
		err = snap.Persist(sink)
		snap.Release()
		if err != nil {
			return fmt.Errorf("write the restored cluster's snapshot: %w", err)
		}
		logger.Info("started the cluster restored from a backup", "backup_index", m.From, "index", m.Index, "voters", len(servers))
	}
	if err := os.Remove(filepath.Join(cfg.Dir, store.RestoreMarkerFile)); err != nil {
		return fmt.Errorf("remove the restore marker: %w", err)
	}
	return nil
}
