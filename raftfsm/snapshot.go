package raftfsm

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"stockd/raftfsm/store"

	"github.com/hashicorp/raft"
	bolt "go.etcd.io/bbolt"
)

// A raft snapshot of this ledger is a reference to the ledger file, not a
// copy of it. The file is durable on its own: Snapshot writes everything
// applied into it (bbolt fsyncs each commit) before raft may compact the
// log, and the file only moves forward from there (a compaction or a
// restore replaces it by rename with a file at the same or a later
// index). So the snapshot raft keeps on disk is a few bytes naming the
// index the file held (SnapshotRef), and when raft opens a snapshot to
// send it to a follower that fell behind the log, the node's snapshot
// store streams the ledger file as it is then (OpenStream): a consistent
// bbolt copy at an index at or after the snapshot's. The follower's
// apply skips the entries up to the index its restored file holds, which
// raft then sends it again.
//
// A copy of a ledger of 10 million orders is 2.4 GB, written each time
// the log grows by a quarter of that: a core's worth of CPU for a second
// or more, and twice the ledger's size on disk for the two snapshots
// kept. etcd keeps its
// bbolt backend out of its raft snapshots for the same reason.
//
// The price: a node whose ledger file is lost cannot rebuild it from its
// own snapshot. It refuses to start (raftnode's catch-up), and is rebuilt
// by rejoining with an empty data dir or from a backup. Snapshots that do
// hold a copy (those a leader sent, or written by an earlier version) are
// read as before.

// snapshotRefMagic starts a snapshot that is a reference. A bbolt file
// starts with its first page's id, eight zero bytes, so the two cannot
// be confused.
const snapshotRefMagic = "STOCKDSR"

// snapshotRefMaxBytes bounds a reference's JSON body: a damaged file must
// not make a reader allocate without bound.
const snapshotRefMaxBytes = 4 << 10

// ErrLedgerBehindSnapshot: the ledger file holds less than a snapshot that
// refers to it says it held (it was lost, or replaced by an older copy).
var ErrLedgerBehindSnapshot = errors.New("the ledger file is behind the raft snapshot that refers to it")

// SnapshotRef is the body of a raft snapshot that refers to the ledger
// file: the file held every entry up to AppliedIndex when it was taken.
type SnapshotRef struct {
	AppliedIndex uint64 `json:"applied_index"`
}

// ReadSnapshotRef reads the start of a raft snapshot. A reference comes
// back as ref, with rest nil; anything else (a copy of a ledger file)
// comes back as rest, which reads the whole snapshot from its first
// byte. Any goroutine may call it.
func ReadSnapshotRef(r io.Reader) (ref *SnapshotRef, rest io.Reader, err error) {
	br := bufio.NewReader(r)
	head, err := br.Peek(len(snapshotRefMagic))
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, nil, fmt.Errorf("read snapshot: %w", err)
	}
	if string(head) != snapshotRefMagic {
		return nil, br, nil
	}
	body, err := io.ReadAll(io.LimitReader(br, int64(len(snapshotRefMagic)+snapshotRefMaxBytes+1)))
	if err != nil {
		return nil, nil, fmt.Errorf("read snapshot reference: %w", err)
	}
	body = body[len(snapshotRefMagic):]
	if len(body) > snapshotRefMaxBytes {
		return nil, nil, fmt.Errorf("snapshot reference of more than %d bytes", snapshotRefMaxBytes)
	}
	ref = new(SnapshotRef)
	if err := json.Unmarshal(body, ref); err != nil {
		return nil, nil, fmt.Errorf("decode snapshot reference: %w", err)
	}
	return ref, nil, nil
}

// Snapshot writes every applied change into the ledger file and returns
// a reference to it at the applied index. Raft calls it on the FSM
// goroutine, so nothing is applied meanwhile: the file holds the
// snapshot's index before raft may compact the log up to it.
func (l *Ledger) Snapshot() (raft.FSMSnapshot, error) {
	if err := l.Flush(); err != nil {
		return nil, fmt.Errorf("persist before snapshot: %w", err)
	}
	return &ledgerRef{ref: SnapshotRef{AppliedIndex: l.AppliedIndex()}}, nil
}

type ledgerRef struct{ ref SnapshotRef }

func (s *ledgerRef) Persist(sink raft.SnapshotSink) error {
	body, err := json.Marshal(s.ref)
	if err == nil {
		_, err = sink.Write(append([]byte(snapshotRefMagic), body...))
	}
	if err != nil {
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
	index = store.AppliedIn(tx)
	pr, pw := io.Pipe()
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, err := tx.WriteTo(pw)
		pw.CloseWithError(err)
	}()
	return &ledgerStream{PipeReader: pr, tx: tx, done: done}, tx.Size(), index, nil
}

// ledgerStream reads a bbolt copy written by a goroutine of its own;
// Close ends that goroutine and then the read transaction.
type ledgerStream struct {
	*io.PipeReader
	tx   *bolt.Tx
	done chan struct{}
}

func (s *ledgerStream) Close() error {
	s.PipeReader.Close() // a write still under way fails, and WriteTo returns
	<-s.done
	return s.tx.Rollback()
}

// Restore replaces the ledger file with a snapshot stream (a copy of a
// ledger file) and reloads the mirrors; the observer then sees
// EventReplaced. A reference to this ledger's own file at or below its
// applied index changes nothing; one above it is ErrLedgerBehindSnapshot.
func (l *Ledger) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	ref, rest, err := ReadSnapshotRef(rc)
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
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("create %s: %w", tmp, err)
	}
	if _, err := io.Copy(f, rest); err != nil {
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

// checkSnapshotFormat refuses a snapshot of a later format (a leader of a
// later version sent it) before it replaces the ledger: this node would
// misread it. Upgrade this node, and it takes the snapshot again.
func checkSnapshotFormat(path string) (err error) {
	defer func() {
		if r := recover(); r != nil { // bbolt panics on pages it cannot read
			err = fmt.Errorf("snapshot %s is damaged: %v", path, r)
		}
	}()
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, Timeout: store.OpenTimeout})
	if err != nil {
		return fmt.Errorf("open snapshot %s: %w", path, err)
	}
	defer db.Close()
	return db.View(func(tx *bolt.Tx) error {
		_, err := store.CheckFormat(tx.Bucket(store.BucketMeta))
		if err != nil {
			return fmt.Errorf("snapshot: %w", err)
		}
		return nil
	})
}
