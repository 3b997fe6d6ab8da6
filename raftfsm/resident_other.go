//go:build !unix

package raftfsm

import bolt "go.etcd.io/bbolt"

// dropResidentPages does nothing where there is no madvise: the pages a
// full scan touched stay resident until the kernel wants them back.
func dropResidentPages(*bolt.DB) {}
