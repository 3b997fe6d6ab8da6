package node

import (
	"context"
	"errors"
	"fmt"
	"time"

	"stockd.dev/stockd/httpapi"
	"stockd.dev/stockd/peer"
	"stockd.dev/stockd/raftfsm"
	"stockd.dev/stockd/raftnode"
)

// clusterView gives the engine (engine.Cluster) and the HTTP layer
// (httpapi.Cluster) their views of raft. node is set once raft runs,
// before either uses it.
type clusterView struct {
	node   *raftnode.Node
	ledger *raftfsm.Ledger
	peers  *peer.Client
}

// nodePeers is the HTTP layer's view of the node-to-node wire: the client
// for the calls it relays, the service for telling a peer's request.
type nodePeers struct {
	*peer.Client
	*peer.Service
}

var _ httpapi.Peers = nodePeers{}

// peerView is what the peer service reads of this node.
type peerView struct{ c *clusterView }

func (v peerView) Status() any { return v.c.Status() }
func (v peerView) LeaderReadIndex(ctx context.Context, lease bool) (uint64, error) {
	if lease {
		return v.c.node.LeaseReadIndex()
	}
	return v.c.LeaderReadIndex(ctx)
}

// rulesProbeTimeout bounds the leader's question to one voter about the
// ledger rules its binary knows.
const rulesProbeTimeout = time.Second

// readIndexAskMax bounds a follower's question to the leader for a read
// index.
const readIndexAskMax = time.Second

// VotersKnowRules asks every other voter (GET /internal/v1/status) for
// the newest ledger rules its binary applies. A voter that does not
// answer, or answers without them (a version before rules), does not
// know them.
func (c *clusterView) VotersKnowRules(rules uint64) bool {
	members, err := c.node.Members()
	if err != nil {
		return false
	}
	self := c.node.Status().ID
	for _, m := range members {
		if m.ID == self {
			continue
		}
		var st httpapi.ClusterStatus
		if err := c.peers.Status(m.ID, rulesProbeTimeout, &st); err != nil || st.RulesKnown < rules {
			return false
		}
	}
	return true
}

// LeaderReadIndex is the leader's side of ReadIndex.
func (c *clusterView) LeaderReadIndex(ctx context.Context) (uint64, error) {
	return c.node.ReadIndex(ctx)
}

// ReadIndex returns an index every write the cluster acknowledged before
// the call has reached: the leader's own, or the one it answers on
// GET /internal/v1/read-index.
func (c *clusterView) ReadIndex(ctx context.Context) (uint64, error) {
	return c.readIndex(ctx, false)
}

// LeaseReadIndex is ReadIndex on the leader's lease (raftnode's
// LeaseReadIndex): no quorum round.
func (c *clusterView) LeaseReadIndex(ctx context.Context) (uint64, error) {
	return c.readIndex(ctx, true)
}

func (c *clusterView) readIndex(ctx context.Context, lease bool) (uint64, error) {
	if c.node.IsLeader() {
		if lease {
			return c.node.LeaseReadIndex()
		}
		return c.node.ReadIndex(ctx)
	}
	id, _ := c.node.Leader()
	if id == "" {
		return 0, errors.New("no raft leader known")
	}
	timeout := readIndexAskMax
	if d, ok := ctx.Deadline(); ok {
		timeout = min(timeout, time.Until(d))
	}
	index, err := c.peers.ReadIndex(id, timeout, lease)
	if err != nil {
		return 0, fmt.Errorf("ask leader %s for a read index: %w", id, err)
	}
	return index, nil
}

// httpAddrOf is the HTTP address node id registered in the ledger (the
// peer address of a cluster without node certificates).
func (c *clusterView) httpAddrOf(id string) string { return c.ledger.NodeAddrs()[id] }

// raftAddrOf is node id's raft address, its node port on a cluster of
// node certificates.
func (c *clusterView) raftAddrOf(id string) string {
	if c.node == nil {
		return ""
	}
	if leader, addr := c.node.Leader(); leader == id && addr != "" {
		return addr
	}
	members, err := c.node.Members()
	if err != nil {
		return ""
	}
	for _, m := range members {
		if m.ID == id {
			return m.Addr
		}
	}
	return ""
}

func (c *clusterView) IsLeader() bool                     { return c.node.IsLeader() }
func (c *clusterView) CommitHealthy() bool                { return c.node.CommitHealthy() }
func (c *clusterView) Unreachable() map[string]time.Time  { return c.node.Unreachable() }
func (c *clusterView) AddVoter(id, raftAddr string) error { return c.node.AddVoter(id, raftAddr) }
func (c *clusterView) RemoveServer(id string) error       { return c.node.RemoveServer(id) }

func (c *clusterView) MemberIDs() ([]string, error) {
	members, err := c.node.Members()
	if err != nil {
		return nil, err
	}
	ids := make([]string, len(members))
	for i, m := range members {
		ids[i] = m.ID
	}
	return ids, nil
}

func (c *clusterView) Status() httpapi.ClusterStatus {
	st := c.node.Status()
	out := httpapi.ClusterStatus{
		NodeID: st.ID, State: st.State, Leader: st.LeaderID, Term: st.Term,
		CommitIndex: st.CommitIndex, AppliedIndex: st.AppliedIndex, LedgerIndex: st.LedgerIndex,
		LedgerRules: c.ledger.Rules(), RulesKnown: raftfsm.RulesCurrent,
	}
	if !st.LastContact.IsZero() {
		out.LastContact = st.LastContact.UTC().Format(time.RFC3339Nano)
	}
	for _, v := range st.Voters {
		out.Nodes = append(out.Nodes, httpapi.NodeStatus{ID: v.ID, RaftAddr: v.Addr})
	}
	return out
}
