// Package raftfsm is the replicated ledger: the deterministic application
// of the commands and the state they build, as a raft state machine
// (raft.FSM). Package raftnode runs the raft node that orders the commands;
// this package knows nothing of transports or log stores.
//
// Beside it, each in a package of its own: the commands, their results and
// their codec (command); order ids (orderid); the ledger's file (store:
// its buckets and format, the write-behind persister, order records and
// blocks, snapshots, backups, restores); the order feed (orderfeed); the
// lottery's ranking (lottery); the in-memory index of request ids
// (requestindex). The domain types every layer speaks are in package
// stock.
//
// What it owns: ledger.db (rows per SKU, orders, request ids by time,
// per-user counts, node addresses, the order feed's events and consumers,
// lottery entries, the ledger rules, the last log index it holds).
//
// Goroutines: ApplyBatch, Snapshot and Restore run on raft's FSM
// goroutine. ApplyBatch applies a batch of committed entries in memory and
// hands the changes to the persister goroutine (store.WriteBehind), which writes
// them to bbolt in larger transactions with the index they reach: only the
// raft log stands between a take and its answer. After a crash the ledger
// opens at its persisted index and raft replays the entries after it
// (Apply skips those at or below the index it holds). Snapshot writes
// everything applied first, so raft never compacts away an entry the
// ledger lacks, and a raft snapshot is then only a reference to the file
// at that index; a follower that needs one is sent the file as it is
// (OpenStream, store.Stream). A compaction goroutine copies the file
// without its free pages after an archive (compact.go).
//
// Apply depends on the log alone: every command names what it acts on in
// terms every node reads alike, whatever version wrote its file (an
// archive's PurgeOrders steps name their orders by id); a change of how an
// entry is judged is switched on through the log (rules.go).
//
// The order feed (orderfeed): every order event gets the next sequence
// number as it is applied, so every node numbers the same events alike;
// the newest events stay in memory, the persister writes them with the
// rest. Pruning goes through the log (PruneEvents) and the persister
// deletes lazily.
//
// Reads (SKU, Order, audits) may come from any goroutine: rows, holds,
// per-user counts and a hash index of request ids are mirrored in memory
// and swapped under a lock after each batch; order reads look at the
// pending changes, then bbolt; lock-free Bloom filters answer "this request
// id (buyer) is surely unknown" for the deduct path.
//
// What crosses the boundary: Commands in (through raft), Results out (per
// command, per Take entry: outcomes are values, not errors), Events to the
// Observer after each batch (lease granted or wanted, stock changed,
// reclaimed, replaced by a snapshot).
package raftfsm
