package node

import (
	"time"

	"stockd/httpapi"
	"stockd/raftfsm"
)

// clusterView gives the engine (engine.Cluster) and the HTTP layer
// (httpapi.Cluster) their views of raft. node is set once raft runs,
// before either uses it.
type clusterView struct {
	node   *raftfsm.Node
	ledger *raftfsm.Ledger
	peers  *httpapi.PeerClient
}

// rulesProbeTimeout bounds the leader's question to one voter about the
// ledger rules its binary knows.
const rulesProbeTimeout = time.Second

// VotersKnowRules asks every other voter (GET /internal/v1/status) for
// the newest ledger rules its binary applies. A voter that does not
// answer, or answers without them (a version before rules), does not
// know them.
func (c *clusterView) VotersKnowRules(rules uint64) bool {
	members, err := c.node.Members()
	if err != nil {
		return false
	}
	addrs := c.ledger.NodeAddrs()
	self := c.node.Status().ID
	for _, m := range members {
		if m.ID == self {
			continue
		}
		addr := addrs[m.ID]
		if addr == "" {
			return false
		}
		var st httpapi.ClusterStatus
		if err := c.peers.GetJSON(addr, "/internal/v1/status", rulesProbeTimeout, &st); err != nil || st.RulesKnown < rules {
			return false
		}
	}
	return true
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
