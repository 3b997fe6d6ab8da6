// Package peer is the node-to-node wire, both ends: the client a node
// calls its peers with (forwarded commands, read indexes, status probes,
// relayed public calls, a join), and the service that answers those calls
// on the leader and every other node (the /internal/v1/ routes), with the
// credentials they carry, the wire's version and its limits.
//
// A follower's take travels: engine committer -> node.Proposer.Propose ->
// Client.Propose (POST /internal/v1/propose, the command in the ledger's
// binary encoding) -> the leader's Service -> Proposals.HandleForwarded
// (node.Proposer) -> raft; the encoded result comes back the same way.
//
// The public HTTP contract (httpapi) reaches peers only through the small
// interface it declares (httpapi.Peers), which Client implements: neither
// package imports the other, and node wires them.
package peer
