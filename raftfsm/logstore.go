package raftfsm

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	wal "github.com/hashicorp/raft-wal"
	"github.com/hashicorp/raft-wal/metadb"
)

// Raft log stores (BENCHMARKS.md has the measurement behind the default).
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

// walStore is raft-wal with its meta store, closed together.
type walStore struct {
	*wal.WAL
	meta *metadb.BoltMetaDB
}

func (s *walStore) Close() error {
	err := s.WAL.Close()
	if merr := s.meta.Close(); err == nil {
		err = merr
	}
	return err
}

// openLogStore opens the data dir's raft log: the store it already holds,
// else a new one of kind want.
func openLogStore(dir, want string, hlog hclog.Logger) (logStore, string, error) {
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
		w, err := wal.Open(walDir, wal.WithLogger(hlog), wal.WithMetaStore(meta))
		if err != nil {
			meta.Close()
			return nil, kind, fmt.Errorf("open raft log %s: %w", walDir, err)
		}
		return &walStore{WAL: w, meta: meta}, kind, nil
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
