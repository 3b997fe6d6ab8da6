package store

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"
)

// bbolt buckets of the ledger file.
var (
	BucketMeta   = []byte("meta")
	BucketSKUs   = []byte("skus")
	BucketOrders = []byte("orders")
	BucketBuyers = []byte("buyers")
	BucketNodes  = []byte("nodes")
	// requests maps request ids to their order ids, a log entry's ids in
	// one group keyed by the orders' creation time (8-byte big-endian unix
	// nanos; see requestGroupFormat); files of format 1 have a record an
	// id, keyed by the time then the id. New ids append at the end of the
	// B+tree instead of dirtying random pages, and pruning by age picks
	// the same ids on every node. Lookups by request id go through the
	// in-memory mirror.
	BucketRequestsByTime = []byte("requests_by_time")

	keyApplied = []byte("applied_index")
	// KeyFormat is the file's format (big-endian uint32); absent: 1.
	KeyFormat = []byte("format")
)

// Format is the format this version writes: 2 has request groups
// and the feed's events in chunks, 3 the orders a take sells in blocks
// (order_blocks.go). It reads every format up to it, and
// refuses a file of a later one rather than misread it.
const Format = 3

// ErrFormat is a file written by a later version.
var ErrFormat = errors.New("the ledger file was written by a later version of stockd")

// CheckFormat reads a file's format from its meta bucket (nil: a new
// file) and refuses one this version cannot read.
func CheckFormat(meta *bolt.Bucket) (uint32, error) {
	format := uint32(1)
	if meta != nil {
		if v := meta.Get(KeyFormat); len(v) == 4 {
			format = binary.BigEndian.Uint32(v)
		}
	}
	if format > Format {
		return format, fmt.Errorf("%w (format %d; this one reads up to %d)", ErrFormat, format, Format)
	}
	return format, nil
}

const (
	FileName    = "ledger.db"
	OpenTimeout = 5 * time.Second // waiting for another process's file lock
	// MmapBytes is mapped up front: bbolt must remap to grow, and a
	// remap waits for every read transaction (audits, snapshot streams), so
	// without headroom a long read would stall Apply. Address space only.
	MmapBytes = 4 << 30
)

var (
	BucketEvents    = []byte("events")
	BucketConsumers = []byte("consumers")
	KeyFeedSeq      = []byte("feed_seq")   // the last event in bucket events
	KeyFeedFloor    = []byte("feed_floor") // events at or below this sequence are pruned
)

// bbolt buckets of lottery entries.
var (
	// entries: sku 0x00 be64(seq) -> entry record, in log order per sale.
	BucketEntries = []byte("entries")
	// entry_users: sku 0x00 user -> be64(seq): one entry per user.
	BucketEntryUsers = []byte("entry_users")
)

// AppliedIn is the last log index a ledger file's transaction holds.
func AppliedIn(tx *bolt.Tx) uint64 {
	if v := tx.Bucket(BucketMeta).Get(keyApplied); len(v) == 8 {
		return binary.BigEndian.Uint64(v)
	}
	return 0
}

// PagesInUse is the bytes up to db's high-water page.
func PagesInUse(db *bolt.DB) int64 {
	var n int64
	_ = db.View(func(tx *bolt.Tx) error {
		n = tx.Size()
		return nil
	})
	return n
}

// viewFile opens the ledger file at path read-only and runs fn in a read
// transaction. A file that does not open or read (bbolt panics on pages
// it cannot read) is the error damaged makes of what went wrong.
func viewFile(path string, damaged func(what string) error, fn func(tx *bolt.Tx) error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = damaged(fmt.Sprintf("does not read: %v", r))
		}
	}()
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, Timeout: OpenTimeout})
	if err != nil {
		return damaged(fmt.Sprintf("does not open: %v", err))
	}
	defer db.Close()
	return db.View(fn)
}
