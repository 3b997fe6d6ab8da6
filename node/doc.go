// Package node runs one stockd node: it wires the ledger, the raft node,
// the engine, the two HTTP doors (httpapi's handlers and the event loop
// in front of them) and the node-to-node wire (peer) together, and owns
// the Proposer through which every write reaches the log (and which
// decides, on the leader, what a forwarded command may do).
//
// Life of a deduct (wait=commit), hop by hop:
//
//  1. One of two doors reads the request with deductwire.Reader: the
//     event loop (httpapi/eventloop, on by default on Linux, plain HTTP),
//     whose one goroutine reads the socket, parses the head with
//     fasthttp's header parser and calls engine.Engine.DeductAsync; or
//     httpapi.Server.handleDeduct on a fasthttp goroutine (HTTPS, the
//     loop off, or a connection the loop handed over), which calls
//     engine.Engine.Deduct and waits.
//  2. The engine checks the sale's flags, takes a unit from a per-core
//     bucket with a CAS, queues a pendingTake and waits on it.
//  3. The engine's committer goroutine gathers queued takes into one
//     command.Take (bounded by entries and encoded bytes) and hands it to
//     Proposer.Propose on a goroutine of its own, a few in flight.
//  4. Proposer.Propose encodes the command once. On the leader it goes
//     straight to raft (raftnode.Node.ProposeEncoded). On a follower it is
//     POSTed to the leader's /internal/v1/propose (peer.Client.Propose),
//     where peer.Service checks the caller and Proposer.HandleForwarded
//     decodes, checks and proposes it and sends back the encoded Result;
//     the follower then waits until its own ledger has applied that index.
//  5. raft commits the entry on a quorum; raftfsm.Ledger.ApplyBatch (the
//     FSM goroutine) applies it on every node; the proposer's future
//     returns the per-entry results.
//  6. The committer settles each take. At the loop's door the settling
//     goroutine runs the take's callback, which writes deductwire's answer
//     to the socket; at fasthttp's the waiting request goroutine wakes and
//     writes the same answer.
//
// Errors are translated once, here: raft's and the wire's failures become
// the engine's sentinels (ErrUnavailable: nothing applied, retry;
// ErrOutcomeUnknown: retry with the same ids; ErrTooLarge, ErrRejected:
// never send the same bytes again).
package node
