package engine

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"stockd.dev/stockd/raftfsm/command"
)

// What the engine, the data plane, offers its control plane (package
// engine/control: sales, orders' confirms and cancels, the archive's
// purge, the order feed, the lottery).

// propose stamps c with the engine's clock and replicates it. Its errors
// are the engine's sentinels (see Proposer).
func (e *Engine) propose(c command.Command) (*command.Result, error) {
	res, err := e.proposer.Propose(e.cfg.Now().UnixNano(), c)
	switch {
	case err == nil:
		e.noteAnswered(res.Index)
		return res, nil
	case errors.Is(err, ErrOutcomeUnknown), errors.Is(err, ErrUnavailable), errors.Is(err, ErrTooLarge), errors.Is(err, ErrRejected):
		return nil, fmt.Errorf("%s: %w", c.Op(), err)
	default:
		// A Proposer breaking its contract: whether c was applied is not
		// known, so its retry must carry the same ids.
		return nil, fmt.Errorf("%w: %s: %w", ErrOutcomeUnknown, c.Op(), err)
	}
}

// Propose stamps c with the engine's clock and replicates it, as the
// engine's own proposals are: its errors are the engine's sentinels.
func (e *Engine) Propose(c command.Command) (*command.Result, error) { return e.propose(c) }

// HoldAck holds the answer to an acknowledged restock, cancel or confirm
// until no node's window to vouch from its own view can still be open
// (vouch.go).
func (e *Engine) HoldAck() { e.holdAck() }

// Config is the configuration the engine runs with.
func (e *Engine) Config() Config { return e.cfg }

// Logger is the engine's logger.
func (e *Engine) Logger() *slog.Logger { return e.logger }

// Metrics are the engine's counters; the control plane counts its own
// events (entries, the feed's pruning) in them too.
func (e *Engine) Metrics() *Metrics { return e.metrics }

// IsLeader reports whether this node leads the cluster (always, without
// one).
func (e *Engine) IsLeader() bool { return e.isLeader() }

// Closing reports whether the node is stopping: new work answers
// unavailable.
func (e *Engine) Closing() bool { return e.closing.Load() }

// Sales is the number of sales this node holds.
func (e *Engine) Sales() int { return len(*e.sales.Load()) }

// LotteriesDue lists the lotteries whose entries closed by now and that
// are not drawn yet (nor closed).
func (e *Engine) LotteriesDue(now time.Time) []string {
	var due []string
	for name, s := range *e.sales.Load() {
		if s.entriesCloseAtUnixNano == 0 || s.drawn.Load() || now.UnixNano() < s.entriesCloseAtUnixNano {
			continue
		}
		row, _, ok := e.ledger.SKU(name)
		if !ok || row.Lottery == nil || row.Lottery.Drawn() || row.Closed() {
			s.drawn.Store(true)
			continue
		}
		due = append(due, name)
	}
	return due
}
