package raftfsm

import (
	"errors"
	"fmt"
	"io"
	"os"
	"stockd.dev/stockd/raftfsm/store"

	"github.com/hashicorp/raft"
)

// ErrLedgerBehindSnapshot: the ledger file holds less than a snapshot that
// refers to it says it held (it was lost, or replaced by an older copy).
var ErrLedgerBehindSnapshot = errors.New("the ledger file is behind the raft snapshot that refers to it")

// Snapshot writes every applied change into the ledger file and returns
// a reference to it at the applied index. Raft calls it on the FSM
// goroutine, so nothing is applied meanwhile: the file holds the
// snapshot's index before raft may compact the log up to it.
func (l *Ledger) Snapshot() (raft.FSMSnapshot, error) {
	if err := l.Flush(); err != nil {
		return nil, fmt.Errorf("persist before snapshot: %w", err)
	}
	return &ledgerRef{ref: store.SnapshotRef{AppliedIndex: l.AppliedIndex()}}, nil
}

type ledgerRef struct{ ref store.SnapshotRef }

func (s *ledgerRef) Persist(sink raft.SnapshotSink) error {
	if err := store.WriteSnapshotRef(sink, s.ref); err != nil {
		sink.Cancel()
		return fmt.Errorf("write snapshot reference: %w", err)
	}
	return sink.Close()
}

func (s *ledgerRef) Release() {}

// OpenStream opens a consistent copy of the ledger file as it is now, at
// the index it returns (at least every index a snapshot refers to): what
// a leader sends a follower that needs a snapshot. Apply goes on
// meanwhile. Close the stream when done: it holds a read transaction,
// which keeps the pages it sees from being reused. Any goroutine may call
// it; the stream is read from one goroutine.
func (l *Ledger) OpenStream() (rc io.ReadCloser, size int64, index uint64, err error) {
	tx, err := l.beginRead()
	if err != nil {
		return nil, 0, 0, fmt.Errorf("begin a copy of the ledger: %w", err)
	}
	return store.Stream(tx), tx.Size(), store.AppliedIn(tx), nil
}

// Restore replaces the ledger file with a snapshot stream (a copy of a
// ledger file) and reloads the mirrors; the observer then sees
// EventReplaced. A reference to this ledger's own file at or below its
// applied index changes nothing; one above it is ErrLedgerBehindSnapshot.
func (l *Ledger) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	ref, rest, err := store.ReadSnapshotRef(rc)
	if err != nil {
		return err
	}
	if ref != nil {
		if have := l.AppliedIndex(); ref.AppliedIndex > have {
			return fmt.Errorf("%w: the snapshot says %d, the file holds %d", ErrLedgerBehindSnapshot, ref.AppliedIndex, have)
		}
		l.logger.Info("the snapshot refers to the ledger file, which holds it already", "snapshot_index", ref.AppliedIndex)
		return nil
	}
	l.restores.Add(1)
	l.logger.Info("restoring the ledger from a snapshot")
	tmp := l.path + ".restore"
	if err := store.WriteSnapshotFile(tmp, rest); err != nil {
		return err
	}

	// The old file is not closed here: bbolt's Close waits for every read
	// transaction, and one may be a copy of this ledger that raft is still
	// sending to a follower, waiting for raft's main loop, which waits for
	// this Restore (the nemesis found that deadlock). The new file goes in
	// place under the old one's name; the old one, already unlinked, is
	// closed once its readers are done. What was pending goes with it: the
	// snapshot replaces everything.
	l.mu.Lock()
	old, oldBH := l.db, l.bh
	if old != nil {
		oldBH.StopAsync()
		l.db = nil
	}
	if err := os.Rename(tmp, l.path); err != nil {
		l.mu.Unlock()
		return fmt.Errorf("replace ledger with snapshot: %w", err)
	}
	err = l.open()
	applied := l.applied
	l.mu.Unlock()
	l.feed.Wake()
	if old != nil {
		go func() {
			oldBH.Wait()
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
