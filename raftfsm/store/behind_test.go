package store

import (
	"path/filepath"
	"sync"
	"testing"

	bolt "go.etcd.io/bbolt"
)

// TestBehind_WritesEachKeysLastChangeOnce: the persister writes from the
// log of changes as applied; a key changed by several batches reaches the
// file with its last value (a deletion too), batches after a write wait
// for the next, and forgetting drops only what the file holds.
func TestBehind_WritesEachKeysLastChangeOnce(t *testing.T) {
	db, err := bolt.Open(filepath.Join(t.TempDir(), "b.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	bucket := []byte("b")
	err = db.Update(func(tx *bolt.Tx) error {
		for _, name := range [][]byte{bucket, BucketMeta} {
			if _, err := tx.CreateBucket(name); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	b := NewWriteBehind(0, new(sync.Mutex), nil)
	b.db = db
	merge := func(index uint64, kv ...string) {
		batch, order := map[string][]byte{}, []string(nil)
		for i := 0; i < len(kv); i += 2 {
			if kv[i+1] == "-" {
				batch[kv[i]] = nil
			} else {
				batch[kv[i]] = []byte(kv[i+1])
			}
			order = append(order, kv[i])
		}
		b.Merge(map[string]map[string][]byte{"b": batch}, map[string][]string{"b": order}, index)
	}
	file := func() map[string]string {
		got := map[string]string{}
		if err := db.View(func(tx *bolt.Tx) error {
			return tx.Bucket(bucket).ForEach(func(k, v []byte) error { got[string(k)] = string(v); return nil })
		}); err != nil {
			t.Fatal(err)
		}
		return got
	}
	want := func(what string, got map[string]string, kv ...string) {
		t.Helper()
		if len(got) != len(kv)/2 {
			t.Fatalf("%s: %v, want %v", what, got, kv)
		}
		for i := 0; i < len(kv); i += 2 {
			if got[kv[i]] != kv[i+1] {
				t.Fatalf("%s: %v, want %v", what, got, kv)
			}
		}
	}

	merge(1, "k3", "a", "k1", "b", "k2", "c")
	merge(2, "k1", "b2", "k2", "-", "k0", "d")
	if err := b.Flush(); err != nil {
		t.Fatal(err)
	}
	want("after the first write", file(), "k0", "d", "k1", "b2", "k3", "a")
	merge(3, "k3", "-", "k4", "e")
	b.ForgetPersisted()
	if v, ok := b.Get(bucket, []byte("k1")); ok {
		t.Fatalf("k1 still pending (%q) after the file took it", v)
	}
	if v, ok := b.Get(bucket, []byte("k3")); !ok || v != nil {
		t.Fatalf("k3's deletion at index 3 not pending: %q %v", v, ok)
	}
	if _, changes := b.Lag(); changes != 2 {
		t.Fatalf("%d changes pending, want 2 (index 3's)", changes)
	}
	merge(4, "k4", "e2")
	if err := b.Flush(); err != nil {
		t.Fatal(err)
	}
	want("after the second write", file(), "k0", "d", "k1", "b2", "k4", "e2")
	b.ForgetPersisted()
	if entries, changes := b.Lag(); entries != 0 || changes != 0 || len(b.log) != 0 || len(b.pending) != 0 {
		t.Fatalf("after forgetting all: lag %d entries %d changes, %d logs, %d pending buckets", entries, changes, len(b.log), len(b.pending))
	}
}
