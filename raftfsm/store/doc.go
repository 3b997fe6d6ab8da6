// Package store is the ledger's file: a bbolt database whose buckets and
// format it defines (file.go), the write-behind persister that writes the
// changes the applier staged, many batches to a transaction, with the log
// index they reach (behind.go), how orders are recorded (one record, or a
// member of a take's block: order_codec.go, order_blocks.go), the scans of
// the orders bucket (scans.go), snapshot references and streams
// (snapshot.go), backup files (backup.go) and the preparation of a restore
// (restore.go).
//
// It knows nothing of commands or of raft: package raftfsm applies the
// log and hands the store what changed.
package store
