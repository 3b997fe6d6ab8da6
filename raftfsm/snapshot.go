package raftfsm

import (
	"fmt"
	"io"
	"os"

	"github.com/hashicorp/raft"
	bolt "go.etcd.io/bbolt"
)

// Snapshot writes every applied change to bbolt, then opens a read
// transaction: a consistent view of the ledger at the applied index, which
// Persist then streams while Apply goes on. Raft calls it on the FSM
// goroutine, so nothing is applied meanwhile: the snapshot covers its
// index, and raft may compact the log up to it.
func (l *Ledger) Snapshot() (raft.FSMSnapshot, error) {
	if err := l.Flush(); err != nil {
		return nil, fmt.Errorf("persist before snapshot: %w", err)
	}
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.db == nil {
		return nil, ErrLedgerClosed
	}
	tx, err := l.db.Begin(false)
	if err != nil {
		return nil, fmt.Errorf("begin snapshot: %w", err)
	}
	return &ledgerSnapshot{tx: tx}, nil
}

type ledgerSnapshot struct{ tx *bolt.Tx }

func (s *ledgerSnapshot) Persist(sink raft.SnapshotSink) error {
	if _, err := s.tx.WriteTo(&pacedWriter{w: sink, maxWait: snapshotPaceMax}); err != nil {
		sink.Cancel()
		return fmt.Errorf("write snapshot: %w", err)
	}
	return sink.Close()
}

func (s *ledgerSnapshot) Release() { _ = s.tx.Rollback() }

// Restore replaces the ledger file with a snapshot stream and reloads the
// mirrors; the observer then sees EventReplaced.
func (l *Ledger) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	l.restores.Add(1)
	l.logger.Info("restoring the ledger from a snapshot")
	tmp := l.path + ".restore"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("create %s: %w", tmp, err)
	}
	if _, err := io.Copy(f, rc); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", tmp, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("sync %s: %w", tmp, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("close %s: %w", tmp, err)
	}
	if err := checkSnapshotFormat(tmp); err != nil {
		os.Remove(tmp)
		return err
	}

	// The old file is not closed here: bbolt's Close waits for every read
	// transaction, and one may be a snapshot of this ledger that raft is
	// still writing out, waiting for raft's main loop, which waits for this
	// Restore (the nemesis found that deadlock). The new file goes in place
	// under the old one's name; the old one, already unlinked, is closed
	// once its readers are done. What was pending goes with it: the
	// snapshot replaces everything.
	l.mu.Lock()
	old, oldBH := l.db, l.bh
	if old != nil {
		oldBH.stopAsync()
		l.db = nil
	}
	if err := os.Rename(tmp, l.path); err != nil {
		l.mu.Unlock()
		return fmt.Errorf("replace ledger with snapshot: %w", err)
	}
	err = l.open()
	applied := l.applied
	l.mu.Unlock()
	l.feed.wake()
	if old != nil {
		go func() {
			oldBH.wait()
			if err := old.Close(); err != nil {
				l.logger.Warn("close the ledger file a snapshot replaced", "err", err)
			}
		}()
	}
	if err != nil {
		return err
	}
	l.notifyApplied()
	l.logger.Info("ledger restored from snapshot", "applied_index", applied)

	l.obsMu.RLock()
	obs := l.observer
	l.obsMu.RUnlock()
	if obs != nil {
		obs.Applied([]Event{{Kind: EventReplaced, Index: applied}})
	}
	return nil
}

// checkSnapshotFormat refuses a snapshot of a later format (a leader of a
// later version sent it) before it replaces the ledger: this node would
// misread it. Upgrade this node, and it takes the snapshot again.
func checkSnapshotFormat(path string) (err error) {
	defer func() {
		if r := recover(); r != nil { // bbolt panics on pages it cannot read
			err = fmt.Errorf("snapshot %s is damaged: %v", path, r)
		}
	}()
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, Timeout: ledgerOpenTimeout})
	if err != nil {
		return fmt.Errorf("open snapshot %s: %w", path, err)
	}
	defer db.Close()
	return db.View(func(tx *bolt.Tx) error {
		_, err := checkLedgerFormat(tx.Bucket(bucketMeta))
		if err != nil {
			return fmt.Errorf("snapshot: %w", err)
		}
		return nil
	})
}
