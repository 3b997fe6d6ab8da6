package raftnode

import (
	"fmt"
	"log/slog"
	"testing"

	"github.com/hashicorp/raft"
)

// TestLogStore_TailTruncationSurvivesRestart: a follower whose log
// diverged drops its tail (raft's DeleteRange of a suffix) and appends the
// leader's entries. raft-wal v0.4.0 marked the old tail segment sealed
// without writing its index, and after a restart the node could not read
// its own log: raft panicked with "sealed segment has no index block" (the
// nemesis found it: a node partitioned, healed, crashed and restarted).
func TestLogStore_TailTruncationSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	open := func() logStore {
		s, kind, err := openLogStore(dir, LogStoreWAL, slog.New(slog.DiscardHandler))
		if err != nil || kind != LogStoreWAL {
			t.Fatalf("open log store: %v (%s)", err, kind)
		}
		return s
	}
	entries := func(from, to uint64, term uint64) []*raft.Log {
		var ls []*raft.Log
		for i := from; i <= to; i++ {
			ls = append(ls, &raft.Log{Index: i, Term: term, Type: raft.LogCommand, Data: []byte(fmt.Sprintf("t%d-%d", term, i))})
		}
		return ls
	}
	s := open()
	if err := s.StoreLogs(entries(1, 10, 1)); err != nil {
		t.Fatal(err)
	}
	// The leader of term 2 disagrees from index 8 on.
	if err := s.DeleteRange(8, 10); err != nil {
		t.Fatal(err)
	}
	if err := s.StoreLogs(entries(8, 12, 2)); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s = open()
	defer s.Close()
	for i := uint64(1); i <= 12; i++ {
		var l raft.Log
		if err := s.GetLog(i, &l); err != nil {
			t.Fatalf("after a restart, entry %d: %v", i, err)
		}
		term := uint64(1)
		if i >= 8 {
			term = 2
		}
		if want := fmt.Sprintf("t%d-%d", term, i); string(l.Data) != want || l.Term != term {
			t.Fatalf("entry %d after a restart: term %d %q, want term %d %q", i, l.Term, l.Data, term, want)
		}
	}
}

// TestLogStore_GuardStopsAfterAFailedAppendFollowingATruncation: raft
// keeps a wrong last index when an append fails right after it dropped a
// diverged suffix (the nemesis saw a follower reject every append for
// good after a full disk). The guard must flag that case, and only that
// one: a failed append after log compaction (a prefix) is not it.
func TestLogStore_GuardStopsAfterAFailedAppendFollowingATruncation(t *testing.T) {
	for _, tc := range []struct {
		name       string
		deleteFrom uint64
		broken     bool
	}{
		{"suffix dropped, then the append fails", 8, true},
		{"prefix compacted, then the append fails", 1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store, _, err := openLogStore(t.TempDir(), LogStoreWAL, slog.New(slog.DiscardHandler))
			if err != nil {
				t.Fatal(err)
			}
			defer store.Close()
			var full bool
			faulty := faultyLogStore{LogStore: store, fault: func() error {
				if full {
					return fmt.Errorf("no space left on device")
				}
				return nil
			}}
			g := newGuardedLogStore(faulty, testLogger(t))
			var transportClosed bool
			g.onBroken = func() { transportClosed = true }
			var ls []*raft.Log
			for i := uint64(1); i <= 10; i++ {
				ls = append(ls, &raft.Log{Index: i, Term: 1, Type: raft.LogCommand})
			}
			if err := g.StoreLogs(ls); err != nil {
				t.Fatal(err)
			}
			to := uint64(10)
			if tc.deleteFrom == 1 {
				to = 5
			}
			if err := g.DeleteRange(tc.deleteFrom, to); err != nil {
				t.Fatal(err)
			}
			full = true
			if err := g.StoreLogs([]*raft.Log{{Index: 11, Term: 2, Type: raft.LogCommand}}); err == nil {
				t.Fatal("append succeeded on a full disk")
			}
			// The transport is closed by the time the failed append
			// returns, so that raft's rejection never reaches the leader.
			if transportClosed != tc.broken {
				t.Fatalf("transport closed: %v, want %v", transportClosed, tc.broken)
			}
			select {
			case <-g.broken:
				if !tc.broken {
					t.Fatal("flagged broken after a failed append following compaction")
				}
			default:
				if tc.broken {
					t.Fatal("not flagged after a failed append following a suffix truncation")
				}
			}
		})
	}
}

// TestLogStore_AppendsAfterAnInstalledSnapshot: a follower far behind gets
// the leader's snapshot; raft compacts its log up to the snapshot's index
// (past the entries the follower has) and then appends the entries that
// follow the snapshot. The log store must take them: with raft-wal, a
// follower in the nemesis was refused ("non-monotonic log entries: tried to
// append index 1056 after 242") and never caught up.
func TestLogStore_AppendsAfterAnInstalledSnapshot(t *testing.T) {
	for _, kind := range []string{LogStoreBolt, LogStoreWAL} {
		t.Run(kind, func(t *testing.T) {
			s, got, err := openLogStore(t.TempDir(), kind, slog.New(slog.DiscardHandler))
			if err != nil || got != kind {
				t.Fatalf("open %s: %v (%s)", kind, err, got)
			}
			defer s.Close()
			var ls []*raft.Log
			for i := uint64(1); i <= 242; i++ {
				ls = append(ls, &raft.Log{Index: i, Term: 1, Type: raft.LogCommand})
			}
			if err := s.StoreLogs(ls); err != nil {
				t.Fatal(err)
			}
			// The snapshot covers up to 1055; raft keeps 16 trailing entries
			// back from its new last index and compacts the rest.
			first, _ := s.FirstIndex()
			if err := s.DeleteRange(first, 1055-16); err != nil {
				t.Fatal(err)
			}
			if err := s.StoreLogs([]*raft.Log{{Index: 1056, Term: 3, Type: raft.LogCommand}}); err != nil {
				t.Fatalf("append after the snapshot: %v", err)
			}
			var l raft.Log
			if err := s.GetLog(1056, &l); err != nil || l.Term != 3 {
				t.Fatalf("read back: %v %+v", err, l)
			}
		})
	}
}

// TestLogStore_WrappersSayWhetherAppendsMustBeContiguous: raft asks the
// log store whether it takes only contiguous appends (raft-wal does) to
// decide what to do with old entries after installing a snapshot. The
// fault and guard wrappers hid raft-wal's answer, and a follower that
// caught up through a snapshot was then refused every append.
func TestLogStore_WrappersSayWhetherAppendsMustBeContiguous(t *testing.T) {
	for kind, want := range map[string]bool{LogStoreWAL: true, LogStoreBolt: false} {
		s, _, err := openLogStore(t.TempDir(), kind, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		wrapped := newGuardedLogStore(faultyLogStore{LogStore: s, fault: func() error { return nil }}, testLogger(t))
		cache, err := raft.NewLogCache(8, wrapped)
		if err != nil {
			t.Fatal(err)
		}
		if got := isMonotonic(cache); got != want {
			t.Errorf("%s behind the wrappers and raft's cache: monotonic %v, want %v", kind, got, want)
		}
		s.Close()
	}
}
