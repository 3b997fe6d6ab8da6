package node

import (
	"time"

	"stockd/httpapi"
	"stockd/raftfsm"
)

// clusterView gives the engine (engine.Cluster) and the HTTP layer
// (httpapi.Cluster) their views of raft. node is set once raft runs,
// before either uses it.
type clusterView struct{ node *raftfsm.Node }

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
	}
	if !st.LastContact.IsZero() {
		out.LastContact = st.LastContact.UTC().Format(time.RFC3339Nano)
	}
	for _, v := range st.Voters {
		out.Nodes = append(out.Nodes, httpapi.NodeStatus{ID: v.ID, RaftAddr: v.Addr})
	}
	return out
}
