package store

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	bolt "go.etcd.io/bbolt"

	"stockd.dev/stockd/internal/fsutil"
	"stockd.dev/stockd/stock"
)

// RestoreIndexGap is how far a restored ledger's log index jumps past its
// backup's. The new cluster's log and feed go on after it, so nothing it
// writes can share an index with what the old cluster wrote after the
// backup: a feed cursor from the old cluster past the backup names an
// index in the gap and gets ErrCursorExpired, never a silent skip.
const RestoreIndexGap = 1 << 32

var (
	// keyRestoredFrom and keyRestoredAt (big-endian uint64) are set in a
	// restored ledger: the backup's index and the index it went on from.
	keyRestoredFrom = []byte("restored_from_index")
	keyRestoredAt   = []byte("restored_at_index")
	// keyClusterID is the identity a restore gives the new cluster; a
	// ledger without one belongs to a cluster that was never restored.
	keyClusterID = []byte("cluster_id")
)

// ClusterIDFor is the identity of the cluster restored from the backup
// whose checksum is sum onto voters (or node alone): every node's restore
// computes the same, and another backup or another set of voters gives
// another.
func ClusterIDFor(sum []byte, node string, voters []RestorePeer) string {
	h := sha256.New()
	h.Write(sum)
	if len(voters) == 0 {
		fmt.Fprintf(h, "\x00%s", node)
	}
	for _, v := range voters {
		fmt.Fprintf(h, "\x00%s=%s", v.ID, v.Addr)
	}
	return hex.EncodeToString(h.Sum(nil)[:16])
}

// RestoreInfo is what PrepareRestore did.
type RestoreInfo struct {
	// From is the backup's index; At is the index the restored ledger is
	// at (From + RestoreIndexGap), where the new cluster's log starts.
	From, At uint64
	// UnitsUnleased are the units leased to the old cluster's nodes that
	// went back to available.
	UnitsUnleased int64
	SKUs          int
	// ClusterID is the new cluster's identity.
	ClusterID string
}

// PrepareRestore turns the ledger file at path, taken out of a backup at
// index from, into the first state of a new cluster: units leased to the
// old cluster's nodes go back to available (the new nodes lease afresh),
// the old nodes' registered addresses are forgotten, and the ledger moves
// to index from + RestoreIndexGap. Orders, request ids, holds (with their
// deadlines), per-user counts, the feed's events and the consumers'
// cursors stay as they were. The file must not be open.
func PrepareRestore(path string, from uint64, clusterID string) (RestoreInfo, error) {
	info := RestoreInfo{From: from, At: from + RestoreIndexGap, ClusterID: clusterID}
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: OpenTimeout})
	if err != nil {
		return info, fmt.Errorf("open the restored ledger: %w", err)
	}
	defer db.Close()
	err = db.Update(func(tx *bolt.Tx) error {
		meta := tx.Bucket(BucketMeta)
		if meta == nil {
			return fmt.Errorf("%w: the ledger has no meta bucket", ErrBackupChecksum)
		}
		if _, err := CheckFormat(meta); err != nil {
			return err
		}
		if v := meta.Get(keyApplied); len(v) != 8 || binary.BigEndian.Uint64(v) != from {
			return fmt.Errorf("%w: the ledger is not at the backup's index %d", ErrBackupChecksum, from)
		}
		skus := tx.Bucket(BucketSKUs)
		err := skus.ForEach(func(k, v []byte) error {
			var s stock.SKU
			if err := json.Unmarshal(v, &s); err != nil {
				return fmt.Errorf("decode sku %q: %w", k, err)
			}
			info.SKUs++
			for _, n := range s.Leased {
				s.Available += n
				info.UnitsUnleased += n
			}
			s.Leased = nil
			if err := s.CheckLaw(); err != nil {
				return fmt.Errorf("sku %q after its leases came back: %w", k, err)
			}
			b, err := json.Marshal(&s)
			if err != nil {
				return err
			}
			return skus.Put(k, b) // replacing a key's value while iterating is allowed
		})
		if err != nil {
			return err
		}
		if err := tx.DeleteBucket(BucketNodes); err != nil {
			return fmt.Errorf("forget the old nodes: %w", err)
		}
		if _, err := tx.CreateBucket(BucketNodes); err != nil {
			return err
		}
		for _, kv := range []struct {
			k []byte
			v uint64
		}{{keyApplied, info.At}, {keyRestoredFrom, info.From}, {keyRestoredAt, info.At}} {
			if err := meta.Put(kv.k, binary.BigEndian.AppendUint64(nil, kv.v)); err != nil {
				return err
			}
		}
		return meta.Put(keyClusterID, []byte(clusterID))
	})
	return info, err
}

// LoadRestored reads a restored ledger's restore points and identity
// (zero: the ledger was not restored).
func LoadRestored(meta *bolt.Bucket) (from, at uint64, clusterID string) {
	if v := meta.Get(keyRestoredFrom); len(v) == 8 {
		from = binary.BigEndian.Uint64(v)
	}
	if v := meta.Get(keyRestoredAt); len(v) == 8 {
		at = binary.BigEndian.Uint64(v)
	}
	return from, at, string(meta.Get(keyClusterID))
}

// RestoreMarkerFile, in a data dir `stockd restore` built, says how the
// node is to start the new cluster on its first serve; the node removes
// it once raft holds the restored state.
const RestoreMarkerFile = "restore.json"

// RestoreMarker is the content of RestoreMarkerFile.
type RestoreMarker struct {
	// NodeID is the only -id this data dir serves.
	NodeID string `json:"node_id"`
	// Index is the restored ledger's index (RestoreInfo.At), where the
	// new cluster's log starts; From is the backup's.
	Index uint64 `json:"index"`
	From  uint64 `json:"from"`
	// Peers are the new cluster's voters (empty: this node alone, at the
	// raft address of its first serve).
	Peers []RestorePeer `json:"peers,omitempty"`
}

// RestorePeer is one voter of a restored cluster.
type RestorePeer struct {
	ID   string `json:"id"`
	Addr string `json:"addr"`
}

// WriteRestoreMarker writes m into dir, synced.
func WriteRestoreMarker(dir string, m RestoreMarker) error {
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	return fsutil.WriteNew(filepath.Join(dir, RestoreMarkerFile), append(b, '\n'), 0o600)
}

// ReadRestoreMarker reads dir's restore marker; ok is false when there is
// none.
func ReadRestoreMarker(dir string) (m RestoreMarker, ok bool, err error) {
	b, err := os.ReadFile(filepath.Join(dir, RestoreMarkerFile))
	if errors.Is(err, fs.ErrNotExist) {
		return m, false, nil
	}
	if err != nil {
		return m, false, err
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return m, false, fmt.Errorf("read %s: %w", RestoreMarkerFile, err)
	}
	return m, true, nil
}
