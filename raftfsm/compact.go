package raftfsm

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"stockd.dev/stockd/raftfsm/store"

	bolt "go.etcd.io/bbolt"
)

// Compaction: bbolt reuses the pages a purge frees but never gives them
// back, so once an archived sale's orders are gone every node rewrites its
// ledger file without them (each on its own: the file's layout is not
// replicated state). The persister is held off while the copy is made, so
// the copy holds every change written so far; changes applied meanwhile
// wait in memory and are written into the new file.

// compactTxBytes bounds one transaction of the copy. bbolt keeps a
// committed transaction's page buffers in a pool for the next: small
// transactions keep that pool small.
const compactTxBytes = 8 << 20

// CompactResult is the file's size before and after a compaction, and the
// bytes of its pages in use (bbolt's high-water page times the page size).
// The file sizes include what bbolt preallocates: it grows a file in 16 MiB
// steps from the high-water mark of whichever commit first needed more, so
// a small file's size depends on when its commits happened and only the
// pages in use compare across a compaction.
type CompactResult struct {
	Before, After           int64
	PagesBefore, PagesAfter int64 // bytes of pages in use
}

// PagesInUse is the bytes up to the ledger file's high-water page: its
// size less what bbolt has preallocated. Any goroutine may call it.
func (l *Ledger) PagesInUse() int64 {
	l.mu.RLock()
	db := l.db
	l.mu.RUnlock()
	if db == nil {
		return 0
	}
	return store.PagesInUse(db)
}

// compactAsync compacts the file in the background (after a purge).
func (l *Ledger) compactAsync() {
	go func() {
		r, err := l.Compact()
		switch {
		case err != nil:
			l.logger.Warn("compact the ledger file", "path", l.path, "err", err)
		case r.Before > 0:
			l.logger.Info("compacted the ledger file", "path", l.path, "bytes_before", r.Before, "bytes_after", r.After, "pages_bytes_before", r.PagesBefore, "pages_bytes_after", r.PagesAfter)
			// The purge freed memory too (orders' request ids, its
			// changes, mapped pages): drop what the file now holds from
			// pending, and give the memory back to the system, once.
			l.mu.RLock()
			bh := l.bh
			l.mu.RUnlock()
			l.applyMu.Lock()
			bh.ForgetPersisted()
			l.applyMu.Unlock()
			// Two collections: the first moves pooled buffers (bbolt's
			// page pool) aside, the second frees them.
			runtime.GC()
			debug.FreeOSMemory()
		}
	}()
}

// Compact rewrites the ledger file without its free pages and swaps it
// in. It is safe while the ledger applies entries; a zero result means
// the file changed under it (a snapshot restore) and was left alone.
func (l *Ledger) Compact() (CompactResult, error) {
	l.compactMu.Lock()
	defer l.compactMu.Unlock()
	if l.closing.Load() {
		return CompactResult{}, ErrLedgerClosed
	}
	l.mu.RLock()
	db, bh := l.db, l.bh
	l.mu.RUnlock()
	if db == nil {
		return CompactResult{}, ErrLedgerClosed
	}
	written, release := bh.Hold()
	defer release()
	if written != db {
		return CompactResult{}, nil
	}
	if err := bh.FlushHeld(); err != nil {
		return CompactResult{}, err
	}
	var res CompactResult
	if st, err := os.Stat(l.path); err == nil {
		res.Before = st.Size()
	}
	res.PagesBefore = store.PagesInUse(db)
	tmp := l.path + ".compact"
	_ = os.Remove(tmp) // left by a crash during an earlier compaction
	dst, err := bolt.Open(tmp, 0o600, &bolt.Options{Timeout: store.OpenTimeout, InitialMmapSize: store.MmapBytes})
	if err != nil {
		return CompactResult{}, fmt.Errorf("open %s: %w", tmp, err)
	}
	abandon := func(err error) (CompactResult, error) {
		dst.Close()
		os.Remove(tmp)
		return CompactResult{}, err
	}
	if err := bolt.Compact(dst, db, compactTxBytes); err != nil {
		return abandon(fmt.Errorf("copy %s: %w", l.path, err))
	}
	res.PagesAfter = store.PagesInUse(dst)
	store.DropResidentPages(db)
	store.DropResidentPages(dst)
	if l.closing.Load() {
		return abandon(ErrLedgerClosed)
	}
	l.mu.Lock()
	if l.db != db {
		l.mu.Unlock()
		return abandon(nil) // restored from a snapshot meanwhile
	}
	if err := os.Rename(tmp, l.path); err != nil {
		l.mu.Unlock()
		return abandon(fmt.Errorf("replace %s: %w", l.path, err))
	}
	l.db = dst
	bh.SwapHeld(dst)
	l.mu.Unlock()
	if d, err := os.Open(filepath.Dir(l.path)); err == nil {
		_ = d.Sync() // the rename survives a crash
		d.Close()
	}
	if st, err := os.Stat(l.path); err == nil {
		res.After = st.Size()
	}
	// Readers of the old file (an audit, a snapshot being sent) finish
	// first: bbolt's Close waits for them.
	go func() {
		if err := db.Close(); err != nil {
			l.logger.Warn("close the ledger file a compaction replaced", "err", err)
		}
	}()
	return res, nil
}

// FileBytes is the ledger file's size on disk.
func (l *Ledger) FileBytes() int64 {
	st, err := os.Stat(l.path)
	if err != nil {
		return 0
	}
	return st.Size()
}
