package store

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"

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

// SnapshotRefMagic starts a snapshot that is a reference. A bbolt file
// starts with its first page's id, eight zero bytes, so the two cannot
// be confused.
const SnapshotRefMagic = "STOCKDSR"

// SnapshotRefMaxBytes bounds a reference's JSON body: a damaged file must
// not make a reader allocate without bound.
const SnapshotRefMaxBytes = 4 << 10

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
	head, err := br.Peek(len(SnapshotRefMagic))
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, nil, fmt.Errorf("read snapshot: %w", err)
	}
	if string(head) != SnapshotRefMagic {
		return nil, br, nil
	}
	body, err := io.ReadAll(io.LimitReader(br, int64(len(SnapshotRefMagic)+SnapshotRefMaxBytes+1)))
	if err != nil {
		return nil, nil, fmt.Errorf("read snapshot reference: %w", err)
	}
	body = body[len(SnapshotRefMagic):]
	if len(body) > SnapshotRefMaxBytes {
		return nil, nil, fmt.Errorf("snapshot reference of more than %d bytes", SnapshotRefMaxBytes)
	}
	ref = new(SnapshotRef)
	if err := json.Unmarshal(body, ref); err != nil {
		return nil, nil, fmt.Errorf("decode snapshot reference: %w", err)
	}
	return ref, nil, nil
}

// WriteSnapshotRef writes a reference snapshot's bytes to w.
func WriteSnapshotRef(w io.Writer, ref SnapshotRef) error {
	body, err := json.Marshal(ref)
	if err == nil {
		_, err = w.Write(append([]byte(SnapshotRefMagic), body...))
	}
	return err
}

// Stream is a copy of the ledger file as tx sees it, written by a
// goroutine of its own; closing it ends that goroutine, then tx.
func Stream(tx *bolt.Tx) io.ReadCloser {
	pr, pw := io.Pipe()
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, err := tx.WriteTo(pw)
		pw.CloseWithError(err)
	}()
	return &ledgerStream{PipeReader: pr, tx: tx, done: done}
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

// WriteSnapshotFile writes a snapshot stream (a copy of a ledger file) to
// path, synced, and checks that this version reads it; on an error the
// file is removed or not to be used.
func WriteSnapshotFile(path string, r io.Reader) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("create %s: %w", path, err)
	}
	if _, err := io.Copy(f, r); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("sync %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("close %s: %w", path, err)
	}
	if err := checkSnapshotFile(path); err != nil {
		os.Remove(path)
		return err
	}
	return nil
}

// checkSnapshotFile refuses a snapshot of a later format (a leader of a
// later version sent it) before it replaces the ledger: this node would
// misread it. Upgrade this node, and it takes the snapshot again.
func checkSnapshotFile(path string) error {
	damaged := func(what string) error { return fmt.Errorf("snapshot %s %s", path, what) }
	return viewFile(path, damaged, func(tx *bolt.Tx) error {
		if _, err := CheckFormat(tx.Bucket(BucketMeta)); err != nil {
			return fmt.Errorf("snapshot: %w", err)
		}
		return nil
	})
}
