package control

import (
	"context"
	"errors"
	"fmt"
	"time"

	"stockd.dev/stockd/engine"
	"stockd.dev/stockd/internal/batcher"
	"stockd.dev/stockd/raftfsm/command"
	"stockd.dev/stockd/stock"
)

// Lottery errors of Enter.
var (
	// ErrNotLottery: an entry into a sale that is first come, first served.
	ErrNotLottery = errors.New("not a lottery")
	// ErrEntriesClosed: the lottery's entries closed (or it was drawn).
	ErrEntriesClosed = errors.New("entries closed")
	// ErrBusy: more entries wait for the log than the node queues; retry.
	ErrBusy = errors.New("too many entries waiting")
	// ErrRequestIDReused: the user already used the entry's request id for
	// a purchase or for another lottery's entry.
	ErrRequestIDReused = errors.New("request id reused")
)

// NotStartedError: the sale opens at At.
type NotStartedError struct{ At time.Time }

func (e *NotStartedError) Error() string {
	return "the sale opens at " + e.At.UTC().Format(time.RFC3339Nano)
}

const (
	// entryQueueMax bounds the entries waiting for a proposal: past it an
	// entrant gets 429 at once instead of a queue that only grows.
	entryQueueMax = 8192
	// enterBatchMax bounds one Enter command (each entry is at most three
	// ids of maxKeyBytes; the byte cap is TakeBatchBytesMax).
	enterBatchMax = 1000
	// enterProposalsMax is the Enter proposals in flight at once.
	enterProposalsMax = 2
	// enterWaitMax bounds how long an entrant waits for the commit.
	enterWaitMax = 10 * time.Second
)

// pendingEntry is one entrant waiting for their Enter to commit.
type pendingEntry struct {
	entry command.EnterEntry
	done  chan struct{}
	res   command.EntryResult
	err   error
}

// Enter enters user into lottery sku and returns their entry (the one they
// already had, for a repeat), once it is committed. Entries from every
// buyer on this node share Enter commands, like takes share Takes.
func (p *Plane) Enter(ctx context.Context, sku, user, requestID string) (stock.Entry, error) {
	if st, ok, err := p.ledger.EntryStatus(sku, user); err != nil || ok {
		return st.Entry, err // a repeat: the first entry, whatever happened since
	}
	row, _, ok := p.ledger.SKU(sku)
	if !ok {
		// Made through another node a moment ago, perhaps.
		if err := p.Engine.CatchUp(ctx); err != nil {
			return stock.Entry{}, err
		}
		row, _, ok = p.ledger.SKU(sku)
	}
	switch {
	case !ok:
		return stock.Entry{}, fmt.Errorf("%w: %q", engine.ErrUnknownSKU, sku)
	case row.Lottery == nil:
		return stock.Entry{}, fmt.Errorf("%w: %q sells first come, first served; deduct instead", ErrNotLottery, sku)
	}
	now := p.cfg.Now().UnixNano()
	switch {
	case row.Config.StartAtUnixNano > now:
		return stock.Entry{}, &NotStartedError{At: time.Unix(0, row.Config.StartAtUnixNano)}
	case row.Closed() || row.Lottery.Drawn() || now >= row.Config.EntriesCloseAtUnixNano:
		return stock.Entry{}, fmt.Errorf("%w: entries to %q closed at %s", ErrEntriesClosed, sku,
			time.Unix(0, row.Config.EntriesCloseAtUnixNano).UTC().Format(time.RFC3339))
	case p.Engine.Closing():
		return stock.Entry{}, fmt.Errorf("%w: node is shutting down", engine.ErrUnavailable)
	}
	// Deducts and entries share the user's ids; the ledger has the last
	// word, this spares it the ones it would refuse.
	if requestID != "" {
		if rec, used := p.ledger.LookupRequest([]byte(user), []byte(requestID)); used {
			// This very entry, sent twice, may have committed through
			// another node since the repeat check above: its entry then.
			if rec.EntrySKU == sku {
				if st, ok, err := p.ledger.EntryStatus(sku, user); err != nil || ok {
					return st.Entry, err
				}
			}
			return stock.Entry{}, fmt.Errorf("%w: user %q used request_id %q for a purchase or another lottery's entry", ErrRequestIDReused, user, requestID)
		}
	}
	pe := &pendingEntry{entry: command.EnterEntry{SKU: sku, User: user, RequestID: requestID}, done: make(chan struct{})}
	select {
	case p.entryQueue <- pe:
	default:
		return stock.Entry{}, fmt.Errorf("%w: %d entries wait for the log on this node", ErrBusy, entryQueueMax)
	}
	ctx, cancel := context.WithTimeout(ctx, enterWaitMax)
	defer cancel()
	select {
	case <-pe.done:
	case <-ctx.Done():
		return stock.Entry{}, fmt.Errorf("%w: the entry did not commit within %s; enter again (a repeat returns the same entry)", engine.ErrOutcomeUnknown, enterWaitMax)
	case <-p.stop:
		// Queued, maybe proposed: a repeat elsewhere finds out.
		return stock.Entry{}, fmt.Errorf("%w: node stopped with the entry queued; enter again (a repeat returns the same entry)", engine.ErrOutcomeUnknown)
	}
	if pe.err != nil {
		return stock.Entry{}, pe.err
	}
	switch pe.res.Outcome {
	case stock.OutcomeOK, stock.OutcomeSame:
		p.Engine.Metrics().CountEntries(1)
		return pe.res.Entry, nil
	case stock.OutcomeUnknownSKU:
		return stock.Entry{}, fmt.Errorf("%w: %q", engine.ErrUnknownSKU, sku)
	case stock.OutcomeNotLottery:
		return stock.Entry{}, fmt.Errorf("%w: %q", ErrNotLottery, sku)
	case stock.OutcomeEntriesClosed:
		return stock.Entry{}, fmt.Errorf("%w: the ledger applied the entry after the close or the draw of %q", ErrEntriesClosed, sku)
	case stock.OutcomeRequestIDReused:
		return stock.Entry{}, fmt.Errorf("%w: user %q used request_id %q for a purchase or another lottery's entry", ErrRequestIDReused, user, requestID)
	}
	return stock.Entry{}, fmt.Errorf("%w: entry %s", engine.ErrInvalid, pe.res.Outcome)
}

// entrants batches queued entries into Enter commands (batcher), with at most
// enterProposalsMax in flight: an idle node proposes a lone entry at once,
// a busy one everything that queued while its proposals were out.
func (p *Plane) entrants() *batcher.Batcher[*pendingEntry] {
	slots := make(chan struct{}, enterProposalsMax)
	return &batcher.Batcher[*pendingEntry]{
		Queue: p.entryQueue, Stop: p.stop, WG: &p.wg,
		Header:   command.EnterHeaderSize,
		Size:     func(p *pendingEntry) int { return p.entry.EncodedSize() },
		MaxItems: enterBatchMax, MaxBytes: p.cfg.TakeBatchBytesMax,
		Slots: func() chan struct{} { return slots },
		Abandon: func(p *pendingEntry) {
			p.finish(command.EntryResult{}, fmt.Errorf("%w: node is shutting down", engine.ErrUnavailable))
		},
		Commit: p.commitEntries,
	}
}

// commitEntries proposes one Enter and answers its entrants once this
// node has applied it (a read here then sees their entries).
func (p *Plane) commitEntries(batch []*pendingEntry) {
	c := &command.Enter{Entries: make([]command.EnterEntry, len(batch))}
	for i, p := range batch {
		c.Entries[i] = p.entry
	}
	res, err := p.Engine.Propose(c)
	if err == nil && len(res.Entries) != len(batch) {
		// The command committed: its entries' fate is not "nothing applied".
		p.logger.Error("BUG: entry results do not match the batch", "entries", len(batch), "results", len(res.Entries))
		err = fmt.Errorf("%w: %d results for %d entries", engine.ErrOutcomeUnknown, len(res.Entries), len(batch))
	}
	if err == nil {
		ctx, cancel := context.WithTimeout(p.stopped, enterWaitMax)
		err = p.ledger.WaitApplied(ctx, res.Index)
		cancel()
		if err != nil {
			err = fmt.Errorf("%w: entries committed, not yet applied here: %w", engine.ErrOutcomeUnknown, err)
		}
	}
	for i, p := range batch {
		var r command.EntryResult
		if err == nil {
			r = res.Entries[i]
		}
		p.finish(r, err)
	}
}

func (p *pendingEntry) finish(r command.EntryResult, err error) {
	p.res, p.err = r, err
	close(p.done)
}

// EntryStatus is where user stands in lottery sku, with their order when
// they won; ok is false when they have no entry.
func (p *Plane) EntryStatus(sku, user string) (stock.EntryStatus, *stock.Order, bool, error) {
	st, ok, err := p.ledger.EntryStatus(sku, user)
	if err != nil || !ok || st.OrderID == "" {
		return st, nil, ok, err
	}
	o, found, err := p.ledger.Order(st.OrderID)
	if err != nil || !found {
		return st, nil, true, err
	}
	return st, &o, true, nil
}

// SaleEntries streams lottery sku's committed entries in log order (see
// raftfsm.Ledger.SaleEntries).
func (p *Plane) SaleEntries(sku string, fn func(*stock.Entry) error) (uint64, error) {
	return p.ledger.SaleEntries(sku, fn)
}

// drawDue proposes the draw of every lottery whose entries have closed,
// from the leader, one proposal at a time: a new leader after a failover
// finds the draw still due (or done) in its ledger, so there is exactly one.
func (p *Plane) drawDue(now time.Time) {
	if !p.Engine.IsLeader() || p.drawing.Load() {
		return
	}
	due := p.Engine.LotteriesDue(now)
	if len(due) == 0 || !p.drawing.CompareAndSwap(false, true) {
		return
	}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		defer p.drawing.Store(false)
		for _, sku := range due {
			start := time.Now()
			res, err := p.Engine.Propose(&command.Draw{SKU: sku})
			if err != nil {
				p.logger.Warn("lottery draw not committed; the leader tries again", "sku", sku, "err", err)
				continue
			}
			p.logger.Info("lottery drawn", "sku", sku, "outcome", res.Outcome.String(), "winners", res.Qty,
				"took", time.Since(start).Round(time.Millisecond))
		}
	}()
}
