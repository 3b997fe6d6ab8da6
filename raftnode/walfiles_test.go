package raftnode

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// walEntries are raft entries from..to of 8 KiB each, their data naming
// their index.
func walEntries(from, to uint64) []*raft.Log {
	var ls []*raft.Log
	for i := from; i <= to; i++ {
		data := bytes.Repeat([]byte{byte(i)}, 8<<10)
		copy(data, fmt.Sprintf("entry %d;", i))
		ls = append(ls, &raft.Log{Index: i, Term: 1, Type: raft.LogCommand, Data: data})
	}
	return ls
}

// walFiles lists the WAL directory: the segments, and the spare's size
// and inode (0 when there is none).
func walFiles(t *testing.T, dir string) (segments []string, spareSize int64, spareIno uint64) {
	t.Helper()
	des, err := os.ReadDir(filepath.Join(dir, raftWALDirName))
	if err != nil {
		t.Fatal(err)
	}
	for _, de := range des {
		switch {
		case strings.HasSuffix(de.Name(), ".wal"):
			segments = append(segments, de.Name())
		case de.Name() == spareSegmentName:
			fi, err := de.Info()
			if errors.Is(err, fs.ErrNotExist) {
				continue // removed since the listing: a spare being replaced
			}
			if err != nil {
				t.Fatal(err)
			}
			spareSize, spareIno = fi.Size(), fi.Sys().(*syscall.Stat_t).Ino
		}
	}
	return segments, spareSize, spareIno
}

// waitSpare waits until files has a whole spare segment ready in the
// store's WAL directory, and returns its inode.
func waitSpare(t *testing.T, s logStore, dir string) uint64 {
	t.Helper()
	files := s.(*walStore).files
	end := time.Now().Add(30 * time.Second)
	for {
		files.mu.Lock()
		ready := files.spare != "" && files.building == nil
		files.mu.Unlock()
		if _, size, ino := walFiles(t, dir); ready && size == walSegmentBytes {
			return ino
		}
		if time.Now().After(end) {
			t.Fatal("no whole spare segment after 30 s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestSegmentFiles_RotateThroughSparesAndReadBackAfterRestart writes
// past three segments: each new segment is the spare written ahead
// (the same file, renamed), a new spare follows, and after a restart
// every entry reads back as written.
func TestSegmentFiles_RotateThroughSparesAndReadBackAfterRestart(t *testing.T) {
	dir := t.TempDir()
	open := func() logStore {
		s, _, err := openLogStore(dir, LogStoreWAL, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	s := open()
	const perSegment = walSegmentBytes / (8 << 10) // entries of 8 KiB a segment, about
	last := uint64(0)
	for seg := 1; seg <= 3; seg++ {
		spareIno := waitSpare(t, s, dir)
		// Fill the current segment and start the next.
		for last < uint64(seg)*perSegment+perSegment/4 {
			if err := s.StoreLogs(walEntries(last+1, last+64)); err != nil {
				t.Fatal(err)
			}
			last += 64
		}
		segments, _, _ := walFiles(t, dir)
		if len(segments) != seg+1 {
			t.Fatalf("%d segments after %d entries, want %d", len(segments), last, seg+1)
		}
		fi, err := os.Stat(filepath.Join(dir, raftWALDirName, segments[len(segments)-1]))
		if err != nil {
			t.Fatal(err)
		}
		if ino := fi.Sys().(*syscall.Stat_t).Ino; ino != spareIno {
			t.Fatalf("segment %d is inode %d, want the spare's %d", seg+1, ino, spareIno)
		}
		if fi.Size() != walSegmentBytes {
			t.Fatalf("segment %d holds %d bytes, want %d", seg+1, fi.Size(), walSegmentBytes)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = open()
	defer s.Close()
	for i := uint64(1); i <= last; i++ {
		var l raft.Log
		if err := s.GetLog(i, &l); err != nil {
			t.Fatalf("after a restart, entry %d: %v", i, err)
		}
		if want := fmt.Sprintf("entry %d;", i); !bytes.HasPrefix(l.Data, []byte(want)) || len(l.Data) != 8<<10 {
			t.Fatalf("entry %d after a restart: %q..., %d bytes", i, l.Data[:16], len(l.Data))
		}
	}
	if err := s.StoreLogs(walEntries(last+1, last+1)); err != nil {
		t.Fatalf("append after a restart: %v", err)
	}
}

// TestSegmentFiles_StaleSpareIsReplaced: a spare left half written by a
// process that stopped is not used; a whole one is written in its place.
func TestSegmentFiles_StaleSpareIsReplaced(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, raftWALDirName), 0o755); err != nil {
		t.Fatal(err)
	}
	stale := filepath.Join(dir, raftWALDirName, spareSegmentName)
	if err := os.WriteFile(stale, []byte("half a spare"), 0o644); err != nil {
		t.Fatal(err)
	}
	s, _, err := openLogStore(dir, LogStoreWAL, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	waitSpare(t, s, dir)
	b, err := os.ReadFile(stale)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(b, make([]byte, walSegmentBytes)) {
		t.Fatalf("the spare is not %d zero bytes", walSegmentBytes)
	}
}

// TestSegmentFiles_CloseStopsTheSpareWriter: Close waits for the writer
// and leaves no half-written spare.
func TestSegmentFiles_CloseStopsTheSpareWriter(t *testing.T) {
	dir := t.TempDir()
	f := newSegmentFiles(slog.New(slog.DiscardHandler))
	w, err := f.Create(dir, "00000000000000000001-0000000000000001.wal", walSegmentBytes)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	f.Close()
	f.mu.Lock()
	building := f.building
	f.mu.Unlock()
	if building != nil {
		t.Fatal("the spare writer is still running after Close")
	}
	if _, err := os.Stat(filepath.Join(dir, spareSegmentName)); err == nil && f.spare == "" {
		t.Fatal("a half-written spare was left behind")
	}
	if _, err := f.Create(dir, "00000000000000000001-0000000000000001.wal", walSegmentBytes); err == nil {
		t.Fatal("Create of an existing segment succeeded")
	}
}
