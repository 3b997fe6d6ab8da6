//go:build !unix

package store

import bolt "go.etcd.io/bbolt"

// DropResidentPages does nothing where there is no madvise: the pages a
// full scan touched stay resident until the kernel wants them back.
func DropResidentPages(*bolt.DB) {}
