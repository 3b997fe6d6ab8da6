package raftnode

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sync"

	walfs "github.com/hashicorp/raft-wal/fs"
	"github.com/hashicorp/raft-wal/types"
)

// walSegmentBytes is the size of a raft-wal segment file: raft-wal's
// default is 64 MiB, and a new segment is written full of zeros (see
// segmentFiles), so a smaller one keeps a node's start, which writes its
// first segment inline, at tens of milliseconds.
const walSegmentBytes = 16 << 20

// spareSegmentName is the next segment being made ready in the WAL's
// directory; raft-wal ignores files without its ".wal" suffix.
const spareSegmentName = "next-segment.spare"

// zeroChunkBytes is the size of one write of zeros.
const zeroChunkBytes = 1 << 20

// segmentFiles is the file system raft-wal keeps its segments on
// (types.VFS): its own, with two changes that make the fsync behind every
// committed entry cheaper.
//
//   - A new segment is written full of zeros and synced before raft-wal
//     writes to it, where raft-wal fallocates it. An append into
//     fallocated space changes the file's extents (unwritten to written),
//     and each fsync then writes that metadata too: on ext4 one more I/O
//     an fsync, beside the data and the cache flush.
//   - Sync is fdatasync: with the blocks written and the size fixed, no
//     metadata a read needs changes, so nothing but the data is written.
//
// Writing a segment's zeros takes the disk a while (16 MiB, about 50 ms
// here), so the next segment is written in the background as soon as one
// is taken, and renamed into place when raft-wal asks for it. A node's
// first segment, and one asked for before its spare is ready, is written
// inline (docs/architecture.md, "The write path: where the ledger's
// time goes").
//
// raft-wal calls Create from its writer (under its own lock); the
// background writer is one goroutine at a time, ended by Close.
type segmentFiles struct {
	*walfs.FS
	logger *slog.Logger

	mu       sync.Mutex
	closed   bool
	spare    string        // the directory holding a ready spare of spareSz bytes; "" when none
	spareSz  uint64        // its size
	building chan struct{} // closes when the spare being written is done (nil: none is)
	stop     chan struct{} // closes on Close: the background writer gives up
}

func newSegmentFiles(logger *slog.Logger) *segmentFiles {
	return &segmentFiles{FS: walfs.New(), logger: logger, stop: make(chan struct{})}
}

// Create returns a new segment file of size bytes, all zeros on disk:
// the spare renamed into place when one of that size is ready, else one
// written now. Either way the next spare is then begun.
func (s *segmentFiles) Create(dir, name string, size uint64) (types.WritableFile, error) {
	path := filepath.Join(dir, name)
	if _, err := os.Lstat(path); err == nil {
		return nil, fmt.Errorf("create raft log segment %s: %w", path, fs.ErrExist)
	}
	s.mu.Lock()
	building := s.building
	s.mu.Unlock()
	if building != nil {
		<-building // bounded: one segment's zeros, or Close
	}
	s.mu.Lock()
	useSpare := s.spare == dir && s.spareSz == size
	s.spare = ""
	s.mu.Unlock()
	var f *os.File
	var err error
	if useSpare {
		if err = os.Rename(filepath.Join(dir, spareSegmentName), path); err == nil {
			f, err = os.OpenFile(path, os.O_RDWR, 0o644)
		}
		if err != nil {
			s.logger.Warn("the raft log segment written ahead could not be used; writing one now", "path", path, "err", err)
			os.Remove(path)
		}
	}
	if f == nil {
		if f, err = writeZeroFile(path, size, nil); err != nil {
			return nil, fmt.Errorf("create raft log segment %s: %w", path, err)
		}
	}
	s.buildSpare(dir, size)
	// The rename or the creation is in the directory, synced on the
	// file's first Sync, before raft-wal acknowledges anything in it.
	return &segmentFile{File: f, dir: dir}, nil
}

// OpenWriter reopens a segment raft-wal writes on (its tail, after a
// restart); its Sync is fdatasync as a new one's.
func (s *segmentFiles) OpenWriter(dir, name string) (types.WritableFile, error) {
	f, err := os.OpenFile(filepath.Join(dir, name), os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	return &segmentFile{File: f, synced: true}, nil
}

// buildSpare starts writing the next segment of size in dir, unless the
// files are closed.
func (s *segmentFiles) buildSpare(dir string, size uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || s.building != nil {
		return
	}
	done := make(chan struct{})
	s.building = done
	go func() {
		defer close(done)
		path := filepath.Join(dir, spareSegmentName)
		os.Remove(path) // a spare left by a process that stopped while writing it
		f, err := writeZeroFile(path, size, s.stop)
		if err == nil {
			err = f.Close()
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		s.building = nil
		if err != nil {
			os.Remove(path)
			if !errors.Is(err, errStopped) {
				s.logger.Warn("the next raft log segment could not be written ahead; it will be written when needed", "path", path, "err", err)
			}
			return
		}
		s.spare, s.spareSz = dir, size
	}()
}

// Close stops the background writer and waits for it; a spare it did
// not finish is removed.
func (s *segmentFiles) Close() {
	s.mu.Lock()
	if !s.closed {
		s.closed = true
		close(s.stop)
	}
	building := s.building
	s.mu.Unlock()
	if building != nil {
		<-building
	}
}

var errStopped = errors.New("stopped")

// writeZeroFile creates path (which must not exist) with size zero bytes
// written and synced, and returns it open for reading and writing. A
// close of stop makes it give up between chunks (errStopped).
func writeZeroFile(path string, size uint64, stop <-chan struct{}) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*os.File, error) {
		f.Close()
		os.Remove(path)
		return nil, err
	}
	zeros := make([]byte, min(size, zeroChunkBytes))
	for off := uint64(0); off < size; off += uint64(len(zeros)) {
		select {
		case <-stop:
			return fail(errStopped)
		default:
		}
		n := min(uint64(len(zeros)), size-off)
		if _, err := f.WriteAt(zeros[:n], int64(off)); err != nil {
			return fail(err)
		}
	}
	if err := f.Sync(); err != nil {
		return fail(err)
	}
	return f, nil
}

// segmentFile is a segment raft-wal writes: Sync is fdatasync, and the
// first Sync of a new one also syncs its directory, which holds its name.
type segmentFile struct {
	*os.File
	dir    string
	synced bool // the directory entry is known to be on disk
}

// Sync makes what was written durable. raft-wal calls it from its writer
// alone.
func (f *segmentFile) Sync() error {
	if err := fdatasync(f.File); err != nil {
		return err
	}
	if f.synced {
		return nil
	}
	d, err := os.Open(f.dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		f.synced = true
	}
	return err
}
