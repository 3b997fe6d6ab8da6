// Package command is the ledger's log entries: one type per op (a sale
// created, a lease, a batch of takes, a lottery entry, an archive's purge
// step, a rules switch, ...), their compact binary encoding
// (EncodeCommand, DecodeCommand) and the JSON form of earlier versions'
// entries (Legacy), still replayed. A command names what it acts on in
// terms every node reads alike; how the ledger applies it is raftfsm's.
// The engine builds commands, node carries them to raft and to the leader,
// raftfsm applies them; this package imports nothing of ours but the
// wire primitives and the order id's format.
package command
