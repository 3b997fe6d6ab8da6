package raftnode

import (
	"context"
	"fmt"
	"maps"
	"time"

	"github.com/hashicorp/raft"
)

// Unreachable returns, on the leader, the peers it has failed to heartbeat
// with their last contact. Empty on followers.
func (n *Node) Unreachable() map[string]time.Time {
	if !n.IsLeader() {
		return nil
	}
	n.contactMu.Lock()
	defer n.contactMu.Unlock()
	return maps.Clone(n.unreachable)
}

// Members returns the voters of the current configuration.
func (n *Node) Members() ([]Peer, error) {
	f := n.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return nil, translateRaftError(err)
	}
	var out []Peer
	for _, s := range f.Configuration().Servers {
		out = append(out, Peer{ID: string(s.ID), Addr: string(s.Address)})
	}
	return out, nil
}

// CommitHealthy reports whether a proposal from this node could commit now:
// its ledger can be written (a node whose disk fails takes no new sales
// until it can), and it leads, having applied everything committed before
// its term (catchUpAsLeader; a leader that loses its quorum steps down
// within the lease timeout), or follows a known leader it heard from within
// a heartbeat timeout.
func (n *Node) CommitHealthy() bool {
	if !n.ledger.PersistHealthy() || n.LogBroken() {
		return false
	}
	if n.IsLeader() {
		return n.freshTerm.Load() == n.raft.CurrentTerm()
	}
	if id, _ := n.Leader(); id == "" {
		return false
	}
	return time.Since(n.raft.LastContact()) <= n.cfg.HeartbeatTimeout
}

// IsLeader reports whether this node is the leader now.
func (n *Node) IsLeader() bool { return n.raft.State() == raft.Leader }

// Leader returns the leader's id and raft address, empty when unknown.
func (n *Node) Leader() (id, addr string) {
	a, i := n.raft.LeaderWithID()
	return string(i), string(a)
}

// WaitLeader blocks until this node knows a leader (itself or another), or
// ctx ends. It says nothing of what this node has applied: Barrier, on the
// leader, or the engine's catch-up, elsewhere.
func (n *Node) WaitLeader(ctx context.Context) error {
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		if id, _ := n.Leader(); id != "" {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for a raft leader: %w", ctx.Err())
		case <-tick.C:
		}
	}
}

// ReadIndex returns, on the leader, a log index that every write
// acknowledged before the call has reached, and every entry any node
// applied before it (committedLedgerIndex), read once it has applied what
// earlier terms committed (catchUpAsLeader) and then confirmed with a
// quorum that it still leads.
// A node whose ledger has applied that index answers a read as the
// cluster would have at the call, which a "no such sale" or "no such
// order" needs: the one answer a node cannot give from its own ledger
// alone. Followers get ErrNotLeader; a leader not yet caught up, or one
// that cannot reach a quorum, ErrNotCaughtUp.
func (n *Node) ReadIndex(ctx context.Context) (uint64, error) {
	if !n.IsLeader() {
		return 0, ErrNotLeader
	}
	term := n.raft.CurrentTerm()
	if n.freshTerm.Load() != term {
		return 0, fmt.Errorf("%w: a new leader has not applied the earlier terms yet", ErrNotCaughtUp)
	}
	index, err := n.committedLedgerIndex()
	if err != nil {
		return 0, err
	}
	verified := make(chan error, 1)
	f := n.raft.VerifyLeader()
	go func() { verified <- f.Error() }() // ends by the leader lease at the latest
	select {
	case err := <-verified:
		if err != nil {
			return 0, fmt.Errorf("%w: %v", ErrNotCaughtUp, err)
		}
	case <-ctx.Done():
		return 0, fmt.Errorf("%w: confirm leadership: %v", ErrNotCaughtUp, ctx.Err())
	}
	if n.raft.CurrentTerm() != term {
		return 0, fmt.Errorf("%w: the term changed", ErrNotCaughtUp)
	}
	return index, nil
}

// LeaseReadIndex is ReadIndex on the leader's lease instead of a quorum
// round: a leader that lost its quorum steps down within
// LeaderLeaseTimeout, before a new leader can be elected (no sooner than
// HeartbeatTimeout after the followers last heard from it), so while this
// node leads, a caught-up term and clocks that run alike make its
// committedLedgerIndex one every acknowledged write has reached. It costs
// no message; a follower's vouch rounds use it (engine, vouch.go), a
// linearizable read and a "not found" the quorum round.
func (n *Node) LeaseReadIndex() (uint64, error) {
	if !n.IsLeader() {
		return 0, ErrNotLeader
	}
	term := n.raft.CurrentTerm()
	if n.freshTerm.Load() != term {
		return 0, fmt.Errorf("%w: a new leader has not applied the earlier terms yet", ErrNotCaughtUp)
	}
	return n.committedLedgerIndex()
}

// committedLedgerIndex is the index a node's ledger stands at once it
// holds every entry this leader has committed: the last command or
// configuration entry (the entries a ledger applies; a no-op or a barrier
// moves no ledger) at or below the commit index. It is not the leader's
// own applied index: the leader's ledger applies a committed entry a
// moment after the commit, and a follower told of the commit may apply it
// first (the leader's apply waiting behind its persister, say) and show
// it, a waiting room's open for one, which is not a write anyone waits
// on. A node that reads after catching up to this index never shows less
// than another node already showed.
func (n *Node) committedLedgerIndex() (uint64, error) {
	applied := n.ledger.AppliedIndex()
	var l raft.Log
	for i := n.raft.CommitIndex(); i > applied; i-- {
		if err := n.logs.GetLog(i, &l); err != nil {
			return 0, fmt.Errorf("%w: read committed log entry %d: %v", ErrNotCaughtUp, i, err)
		}
		if l.Type == raft.LogCommand || l.Type == raft.LogConfiguration {
			return i, nil
		}
	}
	return applied, nil
}

// Barrier waits until every entry committed before it is applied on this
// node (leader only).
func (n *Node) Barrier(timeout time.Duration) error {
	if err := n.raft.Barrier(timeout).Error(); err != nil {
		return translateRaftError(err)
	}
	return nil
}

// Status is a node's view of raft for /v1/cluster and /readyz.
type Status struct {
	ID           string
	State        string
	LeaderID     string
	LeaderAddr   string
	Term         uint64
	CommitIndex  uint64
	AppliedIndex uint64 // raft's: entries handed to the FSM, noops included
	LedgerIndex  uint64 // the last entry the ledger holds, which is what reads reflect
	LastContact  time.Time
	Voters       []Peer
}

// RaftStats is hashicorp/raft's own view of this node (its log's last
// index, its snapshot's, what is pending for the ledger): for a test that
// reports what a stuck cluster was doing.
func (n *Node) RaftStats() map[string]string { return n.raft.Stats() }

// Status reports the node's raft state.
func (n *Node) Status() Status {
	id, addr := n.Leader()
	st := Status{
		ID: n.cfg.NodeID, State: n.raft.State().String(), LeaderID: id, LeaderAddr: addr,
		Term: n.raft.CurrentTerm(), CommitIndex: n.raft.CommitIndex(),
		AppliedIndex: n.raft.AppliedIndex(), LedgerIndex: n.ledger.AppliedIndex(), LastContact: n.raft.LastContact(),
	}
	if f := n.raft.GetConfiguration(); f.Error() == nil {
		for _, s := range f.Configuration().Servers {
			st.Voters = append(st.Voters, Peer{ID: string(s.ID), Addr: string(s.Address)})
		}
	}
	return st
}
