package raftnode

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"

	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	wal "github.com/hashicorp/raft-wal"
	"github.com/hashicorp/raft-wal/metadb"
	"github.com/hashicorp/raft-wal/segment"
)

// Raft log stores (docs/architecture.md, "The write path: where the
// ledger's time goes", says why raft-wal is the default).
const (
	LogStoreWAL  = "wal"
	LogStoreBolt = "bolt"
)

// logStore is what raft needs of its log and stable store, and Close.
type logStore interface {
	raft.LogStore
	raft.StableStore
	Close() error
}

// walStore is raft-wal with its meta store and its segment files,
// closed together.
type walStore struct {
	*wal.WAL
	meta  *metadb.BoltMetaDB
	files *segmentFiles
}

func (s *walStore) Close() error {
	err := s.WAL.Close()
	if merr := s.meta.Close(); err == nil {
		err = merr
	}
	s.files.Close()
	return err
}

// openLogStore opens the data dir's raft log: the store it already holds,
// else a new one of kind want.
func openLogStore(dir, want string, logger *slog.Logger) (logStore, string, error) {
	boltPath, walDir := filepath.Join(dir, raftLogFileName), filepath.Join(dir, raftWALDirName)
	kind := want
	if _, err := os.Stat(boltPath); err == nil {
		kind = LogStoreBolt
	} else if _, err := os.Stat(walDir); err == nil {
		kind = LogStoreWAL
	}
	switch kind {
	case LogStoreBolt:
		s, err := raftboltdb.New(raftboltdb.Options{Path: boltPath})
		if err != nil {
			return nil, kind, fmt.Errorf("open raft log %s: %w", boltPath, err)
		}
		return s, kind, nil
	case LogStoreWAL:
		if err := os.MkdirAll(walDir, 0o755); err != nil {
			return nil, kind, fmt.Errorf("create raft log dir %s: %w", walDir, err)
		}
		// raft-wal v0.4.0's Close leaves its meta store open (and its
		// file locked): own it and close it after the WAL.
		meta := &metadb.BoltMetaDB{}
		files := newSegmentFiles(logger)
		w, err := wal.Open(walDir, wal.WithLogger(newHclogAdapter(logger)), wal.WithMetaStore(meta),
			wal.WithSegmentFiler(segment.NewFiler(walDir, files)), wal.WithSegmentSize(walSegmentBytes))
		if err != nil {
			meta.Close()
			files.Close()
			return nil, kind, fmt.Errorf("open raft log %s: %w", walDir, err)
		}
		return &walStore{WAL: w, meta: meta, files: files}, kind, nil
	}
	return nil, kind, fmt.Errorf("raft log store %q: want %s or %s", want, LogStoreWAL, LogStoreBolt)
}

// faultyLogStore fails appends while fault returns an error: Config.LogFault.
type faultyLogStore struct {
	raft.LogStore
	fault func() error
}

func (s faultyLogStore) StoreLog(l *raft.Log) error {
	if err := s.fault(); err != nil {
		return fmt.Errorf("append to the raft log: %w", err)
	}
	return s.LogStore.StoreLog(l)
}

func (s faultyLogStore) StoreLogs(ls []*raft.Log) error {
	if err := s.fault(); err != nil {
		return fmt.Errorf("append to the raft log: %w", err)
	}
	return s.LogStore.StoreLogs(ls)
}

// guardedLogStore watches for the one log failure raft does not recover
// from in place: a follower that drops a diverged suffix of its log
// (DeleteRange) and then fails to append the leader's entries keeps a last
// index its log no longer has (hashicorp/raft's appendEntries, "TODO:
// leaving r.getLastLog() in the wrong state if there was a truncation
// above"). From then on it rejects every append for good. The guard
// closes broken, and the node stops: a restart reads the log's true end.
//
// Before it closes broken the guard calls onBroken, which closes the
// node's raft transport: a broken follower must not answer the leader
// until it has restarted. Each of its rejections carries the stale last
// index, so the leader steps its next index for the node down by one,
// and in the second before the node stopped the leader walked it down to
// 1 (the nemesis, seed 81177683). Restarted, the node had compacted its
// log's head into a snapshot, so it rejected the entries from index 1
// too, and the leader, which still had them, never sent a snapshot
// instead: the node stayed at its snapshot's index for good. With the
// transport closed the leader's appends fail as calls, which it retries
// with backoff at the same index.
type guardedLogStore struct {
	raft.LogStore
	truncated atomic.Bool // a suffix was deleted and no append has succeeded since
	// appended and appendedBytes count the entries stored and their data's
	// bytes, for the snapshot policy's mean entry size (snapshots.go).
	appended, appendedBytes atomic.Uint64
	broken                  chan struct{}
	onBroken                func() // closes the raft transport; may be nil
	once                    sync.Once
	logger                  *slog.Logger
}

func newGuardedLogStore(s raft.LogStore, logger *slog.Logger) *guardedLogStore {
	return &guardedLogStore{LogStore: s, broken: make(chan struct{}), logger: logger}
}

func (g *guardedLogStore) DeleteRange(min, max uint64) error {
	first, err := g.LogStore.FirstIndex()
	if err == nil && min > first {
		g.truncated.Store(true) // a suffix: raft is rewriting the log's end
	}
	return g.LogStore.DeleteRange(min, max)
}

func (g *guardedLogStore) StoreLog(l *raft.Log) error {
	return g.StoreLogs([]*raft.Log{l})
}

func (g *guardedLogStore) StoreLogs(ls []*raft.Log) error {
	err := g.LogStore.StoreLogs(ls)
	switch {
	case err == nil:
		g.truncated.Store(false)
		var b uint64
		for _, l := range ls {
			b += uint64(len(l.Data))
		}
		g.appended.Add(uint64(len(ls)))
		g.appendedBytes.Add(b)
	case g.truncated.Load():
		g.once.Do(func() {
			g.logger.Error("raft log append failed right after its end was rewritten; raft now believes entries that are gone and rejects every append: this node closes its raft port and stops, restart it once the disk can be written", "err", err)
			if g.onBroken != nil {
				g.onBroken() // before raft answers the append that failed
			}
			close(g.broken)
		})
	}
	return err
}

// isMonotonic passes on raft.MonotonicLogStore: raft-wal takes only
// contiguous appends, and raft must know it, or after installing a
// snapshot it keeps the old entries and appends past a gap, which
// raft-wal refuses for good ("non-monotonic log entries"; the nemesis
// found a follower stuck so behind these wrappers).
func isMonotonic(s raft.LogStore) bool {
	m, ok := s.(raft.MonotonicLogStore)
	return ok && m.IsMonotonic()
}

// IsMonotonic implements raft.MonotonicLogStore.
func (s faultyLogStore) IsMonotonic() bool { return isMonotonic(s.LogStore) }

// IsMonotonic implements raft.MonotonicLogStore.
func (g *guardedLogStore) IsMonotonic() bool { return isMonotonic(g.LogStore) }
