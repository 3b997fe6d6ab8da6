// Package engine sells stock: it owns the sales a node knows, their per-core
// buckets, the leases that fill them, and the group-commit pipeline that
// turns won units into replicated orders.
//
// Goroutines:
//   - request goroutines call Deduct; on the fast path it reads a few
//     atomics, CAS-decrements a bucket and, for a winner, enqueues one take;
//   - the committer gathers queued takes into Take batches and proposes them
//     to the ledger, at most Config.ProposalsInFlightMax at a time, with no
//     fixed timer: a batch leaves as soon as a proposal slot is free;
//   - the leaser proposes Lease commands for sales whose buckets run low;
//   - raft's FSM goroutine calls Applied with ledger events: units enter the
//     buckets only there, when a Lease granted to this node is applied.
//
// The whole life of a deduct, hop by hop through httpapi, engine, node and
// raftfsm, is in node/doc.go.
//
// What crosses the boundary: DeductRequest/DeductResult (caller-owned, byte
// slices in, no allocation for a loser), raftfsm commands out through the
// Proposer, raftfsm events in through Applied.
package engine
