//go:build unix

package store

import (
	"os"

	bolt "go.etcd.io/bbolt"
	"golang.org/x/sys/unix"
)

// DropResidentPages tells the kernel this process no longer needs the
// pages of db's memory map it has touched: a full scan (an audit, loading
// the mirrors) touches every page of ledger.db, and they would otherwise
// stay in the node's resident memory. The pages stay in the page cache, and
// the next read maps them again; the map is read-only and shared, so
// nothing is lost. Errors are ignored: this only trims memory. The caller
// must hold db open (a read transaction, or its own handle nobody else
// closes): on a file being closed the range may already be unmapped, and
// reused by another mapping.
func DropResidentPages(db *bolt.DB) {
	info := db.Info()
	fi, err := os.Stat(db.Path())
	if err != nil || info == nil || info.Data == 0 || fi.Size() <= 0 {
		return
	}
	_, _, _ = unix.Syscall(unix.SYS_MADVISE, info.Data, uintptr(fi.Size()), unix.MADV_DONTNEED)
}
