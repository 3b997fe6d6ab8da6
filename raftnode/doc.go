// Package raftnode runs one raft member with the ledger (raftfsm) as its
// state machine: hashicorp/raft's wiring (the TCP or test stream
// transport, the raft-wal or raft-boltdb log store behind a guard that
// stops the node when raft's view of its log can no longer be trusted, the
// snapshot store, whose snapshots refer to the ledger file and stream it
// to a follower that needs one, an hclog adapter onto slog), bootstrap, leadership
// observation, and the proposal and read-index calls node builds on.
//
// Goroutines: raft's own (leader loop, replication, FSM), an observer of
// leader changes and failed heartbeats, and, on a new leader, one that
// commits a barrier in its term (until then its reads are stale).
//
// What crosses the boundary: encoded commands in (Propose, ProposeEncoded),
// raftfsm Results out, and sentinel errors that say whether a failed
// proposal may still have been applied (ErrOutcomeUnknown) or surely was
// not (ErrNotLeader, ErrShutdown, ErrBusy). node translates them, once,
// into the engine's.
package raftnode
