// Package raftfsm is the replicated ledger: the commands of DESIGN.md, their
// deterministic application to a bbolt file, and the raft node that orders
// them.
//
// What it owns: ledger.db (rows per SKU, orders, request ids by time,
// per-user counts, node addresses, the last applied index) and, through
// hashicorp/raft, raft.db (log and stable store) and snapshots/.
//
// Goroutines: raft's own (leader loop, replication, FSM). ApplyBatch,
// Snapshot and Restore run on raft's FSM goroutine; one bbolt transaction
// (one fsync) covers each batch of committed entries, and the applied index
// is written in the same transaction, so entries at or below it are skipped
// when raft replays its log after a restart. Reads (SKU, Order, audits) may
// come from any goroutine: rows, request ids, holds and per-user counts are
// mirrored in memory and swapped under a lock after each commit; order
// reads and audits use their own read transactions and never hold up Apply.
//
// What crosses the boundary: Commands in (Node.Propose), Results out (per
// command, per Take entry: outcomes are values, not errors), Events to the
// Observer after each durable batch (lease granted, stock changed,
// reclaimed, replaced by a snapshot), and sentinel errors that say whether
// a failed proposal may still have been applied (ErrOutcomeUnknown) or
// surely was not (ErrNotLeader, ErrShutdown, ErrBusy).
package raftfsm
