package node

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"stockd.dev/stockd/httpapi"
	"stockd.dev/stockd/raftfsm"
	"stockd.dev/stockd/raftnode"
)

// BackupSchedule is -backup-dir, -backup-interval and -backup-keep: the
// leader writes a backup file into Dir every Interval and keeps the
// newest Keep. An empty Dir turns it off.
type BackupSchedule struct {
	Dir      string
	Interval time.Duration
	Keep     int
	// FaultFull, when set and true, makes every write fail as on a full
	// disk (tests). Never in production.
	FaultFull *atomic.Bool
}

const (
	backupIntervalMin = 100 * time.Millisecond
	backupKeepMax     = 10_000
	// backupFilePrefix and backupFileSuffix name the scheduled files:
	// stockd-<node>-<UTC time>-<index>.backup, so that names sort by time.
	backupFilePrefix = "stockd-"
	backupFileSuffix = ".backup"
	backupTimeLayout = "20060102T150405.000000000Z"
)

func (b *BackupSchedule) validate() error {
	if b.Dir == "" {
		return nil
	}
	if b.Interval < backupIntervalMin || b.Keep < 1 || b.Keep > backupKeepMax {
		return fmt.Errorf("-backup-interval %s must be at least %s and -backup-keep %d 1 to %d", b.Interval, backupIntervalMin, b.Keep, backupKeepMax)
	}
	return nil
}

// backupScheduler runs the schedule on the leader.
type backupScheduler struct {
	sched   BackupSchedule
	ledger  *raftfsm.Ledger
	raft    *raftnode.Node
	node    string
	version string
	logger  *slog.Logger

	mu          sync.Mutex
	lastSuccess time.Time
	lastBytes   int64
	taken       uint64
	failures    uint64

	stop chan struct{}
	done chan struct{}
}

func (s *backupScheduler) start() {
	s.stop, s.done = make(chan struct{}), make(chan struct{})
	go s.run()
}

func (s *backupScheduler) close() {
	if s.stop == nil {
		return
	}
	close(s.stop)
	<-s.done
}

func (s *backupScheduler) run() {
	defer close(s.done)
	t := time.NewTicker(s.sched.Interval)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		if !s.raft.IsLeader() {
			continue
		}
		started := time.Now()
		name, n, err := s.writeOne()
		s.mu.Lock()
		if err != nil {
			s.failures++
			failures := s.failures
			s.mu.Unlock()
			// The sale goes on: a backup that fails costs nothing but the file.
			s.logger.Warn("scheduled backup failed; the sale goes on", "dir", s.sched.Dir, "err", err, "failures", failures)
			continue
		}
		s.lastSuccess, s.lastBytes = time.Now(), n
		s.taken++
		s.mu.Unlock()
		s.logger.Info("scheduled backup written", "file", name, "bytes", n, "took", time.Since(started).Round(time.Millisecond))
		if err := s.prune(); err != nil {
			s.logger.Warn("pruning old backups failed", "dir", s.sched.Dir, "err", err)
		}
	}
}

// writeOne writes a backup into a temporary file, syncs it and renames it
// into place: a file with a backup's name is always a whole one.
func (s *backupScheduler) writeOne() (string, int64, error) {
	if err := os.MkdirAll(s.sched.Dir, 0o700); err != nil {
		return "", 0, err
	}
	b, err := s.ledger.BeginBackup(s.node, s.version)
	if err != nil {
		return "", 0, err
	}
	defer b.Close()
	name := fmt.Sprintf("%s%s-%s-%d%s", backupFilePrefix, s.node, time.Now().UTC().Format(backupTimeLayout), b.AppliedIndex(), backupFileSuffix)
	tmp, err := os.CreateTemp(s.sched.Dir, ".partial-*"+backupFileSuffix)
	if err != nil {
		return "", 0, err
	}
	ok := false
	defer func() {
		if !ok {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	var w io.Writer = tmp
	if s.sched.FaultFull != nil {
		w = &faultFullWriter{w: tmp, full: s.sched.FaultFull}
	}
	bw := bufio.NewWriterSize(w, 1<<20)
	n, err := b.WriteTo(bw)
	if err == nil {
		err = bw.Flush()
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return "", n, fmt.Errorf("write %s: %w", name, err)
	}
	if err := os.Rename(tmp.Name(), filepath.Join(s.sched.Dir, name)); err != nil {
		return "", n, err
	}
	ok = true
	if d, err := os.Open(s.sched.Dir); err == nil {
		d.Sync()
		d.Close()
	}
	return name, n, nil
}

// prune removes all but the newest Keep scheduled backups of this node.
func (s *backupScheduler) prune() error {
	entries, err := os.ReadDir(s.sched.Dir)
	if err != nil {
		return err
	}
	var mine []string
	for _, e := range entries {
		if n := e.Name(); strings.HasPrefix(n, backupFilePrefix+s.node+"-") && strings.HasSuffix(n, backupFileSuffix) {
			mine = append(mine, n)
		}
	}
	slices.Sort(mine) // by time: the names carry it in a sortable form
	var errs []error
	for _, n := range mine[:max(0, len(mine)-s.sched.Keep)] {
		if err := os.Remove(filepath.Join(s.sched.Dir, n)); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// stats is what /metrics says of the schedule.
func (s *backupScheduler) stats() httpapi.BackupStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return httpapi.BackupStats{LastSuccess: s.lastSuccess, LastBytes: s.lastBytes, Taken: s.taken, Failures: s.failures}
}

// faultFullWriter fails every write with ENOSPC while full is true.
type faultFullWriter struct {
	w    io.Writer
	full *atomic.Bool
}

func (f *faultFullWriter) Write(p []byte) (int, error) {
	if f.full.Load() {
		return 0, &os.PathError{Op: "write", Path: "backup", Err: syscall.ENOSPC}
	}
	return f.w.Write(p)
}
