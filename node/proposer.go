package node

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"stockd.dev/stockd/engine"
	"stockd.dev/stockd/peer"
	"stockd.dev/stockd/raftfsm"
	"stockd.dev/stockd/raftfsm/command"
	"stockd.dev/stockd/raftnode"
)

const (
	// forwardTimeout bounds one forwarded proposal: long enough for an
	// election and a commit, short enough that a buyer gets an answer.
	forwardTimeout = 10 * time.Second
)

// Proposer is the engine's way into the log on every node: it proposes
// locally while this node leads and forwards to the leader otherwise, over
// the internal wire, in the ledger's binary encoding. It is also the
// leader's side of that wire (HandleForwarded). Safe for concurrent use.
type Proposer struct {
	raft   *raftnode.Node
	ledger *raftfsm.Ledger
	peers  *peer.Client
	logger *slog.Logger
}

// Propose implements engine.Proposer.
func (p *Proposer) Propose(atUnixNano int64, c command.Command) (*command.Result, error) {
	b := command.EncodeCommand(nil, atUnixNano, c)
	if len(b) > peer.MaxBodyBytes {
		return nil, fmt.Errorf("%w: %s command of %d bytes, the most is %d", engine.ErrTooLarge, c.Op(), len(b), peer.MaxBodyBytes)
	}
	if p.raft.IsLeader() {
		res, err := p.raft.ProposeEncoded(b)
		return res, translate(err)
	}
	return p.forward(c.Op(), b)
}

// translate maps raftfsm's proposal errors onto the engine's sentinels.
func translate(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, raftnode.ErrOutcomeUnknown):
		return fmt.Errorf("%w: %w", engine.ErrOutcomeUnknown, err)
	case errors.Is(err, raftfsm.ErrMalformed):
		return fmt.Errorf("%w: %w", engine.ErrRejected, err)
	default: // ErrNotLeader, ErrShutdown, ErrBusy: nothing was proposed
		return fmt.Errorf("%w: %w", engine.ErrUnavailable, err)
	}
}

// forward sends an encoded command to the leader and returns its result.
// The command reaches this node's ledger a moment later, when this node
// learns the commit: callers that need it applied here wait for
// Result.Index (the engine does, for the bookkeeping of its takes).
func (p *Proposer) forward(op command.Op, b []byte) (*command.Result, error) {
	leader, _ := p.raft.Leader()
	if leader == "" {
		return nil, fmt.Errorf("%w: no leader known", engine.ErrUnavailable)
	}
	status, answer, err := p.peers.Propose(leader, b, forwardTimeout)
	if err != nil {
		if errors.Is(err, peer.ErrNotSent) {
			return nil, fmt.Errorf("%w: forward %s to %s: %v", engine.ErrUnavailable, op, leader, err)
		}
		return nil, fmt.Errorf("%w: forward %s to %s: %v", engine.ErrOutcomeUnknown, op, leader, err)
	}
	switch status {
	case http.StatusOK:
	case peer.ProposeNotLeader, peer.ProposeUnavailable:
		return nil, fmt.Errorf("%w: leader %s answered %d: %s", engine.ErrUnavailable, leader, status, bytes.TrimSpace(answer))
	case peer.ProposeTooLarge:
		return nil, fmt.Errorf("%w: leader %s: %s", engine.ErrTooLarge, leader, bytes.TrimSpace(answer))
	case peer.ProposeMalformed, peer.ProposeForbidden, http.StatusUnauthorized, http.StatusNotFound:
		p.logger.Error("leader refused a forwarded command", "op", op, "leader", leader, "status", status, "answer", string(bytes.TrimSpace(answer)))
		return nil, fmt.Errorf("%w: leader %s answered %d: %s", engine.ErrRejected, leader, status, bytes.TrimSpace(answer))
	default: // 504 and anything unexpected: the command may have entered the log
		return nil, fmt.Errorf("%w: leader %s answered %d: %s", engine.ErrOutcomeUnknown, leader, status, bytes.TrimSpace(answer))
	}
	res, err := command.DecodeResult(answer)
	if err != nil {
		return nil, fmt.Errorf("%w: decode the leader's answer: %v", engine.ErrOutcomeUnknown, err)
	}
	return res, nil
}

// HandleForwarded implements peer.Proposals: it runs on the leader for
// a command node fromNode forwarded (the caller passed the cluster secret).
// A peer may send only what a peer sends: its own takes, lease requests,
// returns and registration. Admin and order calls travel as relayed HTTP
// requests with the caller's own credentials, not through here. Only a
// decodable, allowed command is proposed; its bytes go into the log as
// they came.
func (p *Proposer) HandleForwarded(fromNode string, body []byte) (int, []byte) {
	if !p.raft.IsLeader() {
		return peer.ProposeNotLeader, peer.ErrorBody("not_leader", "this node is not the leader")
	}
	_, c, err := command.DecodeCommand(body)
	if err != nil {
		return peer.ProposeMalformed, peer.ErrorBody("bad_request", err.Error())
	}
	if why := peerMayNotSend(fromNode, c); why != "" {
		return peer.ProposeForbidden, peer.ErrorBody("forbidden", why) // the HTTP layer logs it, with the peer's address
	}
	// raft keeps the slice: the request's buffer is reused after the call.
	res, err := p.raft.ProposeEncoded(bytes.Clone(body))
	switch {
	case err == nil:
		return http.StatusOK, command.EncodeResult(nil, res)
	case errors.Is(err, raftnode.ErrOutcomeUnknown):
		return peer.ProposeOutcomeUnknown, peer.ErrorBody("outcome_unknown", err.Error())
	case errors.Is(err, raftnode.ErrNotLeader):
		return peer.ProposeNotLeader, peer.ErrorBody("not_leader", err.Error())
	default:
		return peer.ProposeUnavailable, peer.ErrorBody("unavailable", err.Error())
	}
}

// peerMayNotSend says why node from may not propose c, or "" when it may.
func peerMayNotSend(from string, c command.Command) string {
	var node string
	switch c := c.(type) {
	case *command.Take:
		node = c.Node
	case *command.Lease:
		node = c.Node
	case *command.Return:
		node = c.Node
	case *command.Register:
		node = c.Node
	case *command.Enter, *command.Draw, *command.Join:
		// Entries and joins are the buyers', whom the sending node served;
		// a draw is due or refused whoever asks. None speaks for a node.
		if from == "" {
			return fmt.Sprintf("%s needs the sending node's id", c.Op())
		}
		return ""
	default:
		return fmt.Sprintf("%s is not a command a peer sends; admin and order calls are relayed with the caller's credentials", c.Op())
	}
	if from == "" || node != from {
		return fmt.Sprintf("node %q may not send a %s in the name of node %q", from, c.Op(), node)
	}
	return ""
}
