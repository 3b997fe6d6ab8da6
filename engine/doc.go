// Package engine is a node's data plane: it sells stock. It owns the sales
// a node knows, their per-core buckets, the leases that fill them, the
// admission in front of them (engine/admission), and the group-commit
// pipeline that turns won units into replicated orders; and, around them,
// holds and their expiry and the catch-up that makes a "not found" true.
// The control plane (engine/control) runs over it: sales and orders'
// confirms, the order feed, lottery entries and draws, archiving, and the
// leader's housekeeping; the engine offers it Propose and a few reads
// (plane.go) and knows nothing of it.
//
// Goroutines (Start launches the first four; Close stops them all):
//   - the committer gathers won takes into Take batches and proposes each
//     on a goroutine of its own, at most ProposalsInFlightMax (leading) or
//     ForwardedInFlightMax (following) at a time. After a batch of more
//     than one take it lingers up to ForwardLinger / ProposeLinger (1 ms)
//     once a slot frees, so a wave of buyers shares one raft entry; an idle
//     node, or one alone, proposes at once (internal/batcher, which the
//     control plane's lottery entries use too);
//   - the leaser proposes Lease and Return commands for sales whose
//     buckets run low, or that idle, or that another node needs;
//   - the janitor: the commit breaker, the admission limit, idle leases'
//     return, the node's registration; on the leader, expiries of holds
//     and the ledger rules switch;
//   - the poller wakes deducts waiting for units when the ledger changed
//     under them (takes committed on other nodes send no event here);
//   - a catch-up round at a time asks the cluster for a read index while
//     misses wait (catchup.go); a drain watcher while the node stops.
//
// Request goroutines call Deduct: on the fast path it reads a few atomics,
// CAS-decrements a bucket and, for a winner, enqueues one take. Raft's FSM
// goroutine calls Applied with ledger events: units enter the buckets only
// there, when a Lease granted to this node is applied.
//
// The whole life of a deduct, hop by hop through httpapi, engine, node and
// raftfsm, is in node/doc.go.
//
// What crosses the boundary: DeductRequest/DeductResult (caller-owned, byte
// slices in, no allocation for a loser), raftfsm commands out through the
// Proposer (whose errors are the engine's sentinels), the ledger read
// through the Ledger interface's roles, raftfsm events in through Applied.
package engine
