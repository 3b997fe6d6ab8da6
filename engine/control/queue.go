package control

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"stockd.dev/stockd/engine"
	"stockd.dev/stockd/internal/batcher"
	"stockd.dev/stockd/raftfsm"
	"stockd.dev/stockd/raftfsm/command"
	"stockd.dev/stockd/raftfsm/waitroom"
	"stockd.dev/stockd/stock"
)

// QueueLedger reads the waiting room's records.
type QueueLedger interface {
	QueueRecords() waitroom.Reader
}

// Waiting-room errors of Join.
var (
	// ErrNotQueued: the sale has no waiting room.
	ErrNotQueued = errors.New("not queued")
	// ErrSoldOut: nothing can still be won from the sale.
	ErrSoldOut = errors.New("sold out")
)

const (
	// joinQueueMax bounds the joins waiting for a proposal on a node:
	// past it a joiner gets 429 at once.
	joinQueueMax = 16384
	// joinBatchMax bounds one Join command.
	joinBatchMax = 2000
	// joinProposalsMax is the Join proposals in flight at once.
	joinProposalsMax = 2
	// joinWaitMax bounds how long a joiner waits for the commit.
	joinWaitMax = 10 * time.Second
	// TicketWaitMax bounds a ticket's long-poll.
	TicketWaitMax = 60 * time.Second
)

// pendingJoin is one joiner waiting for their Join to commit.
type pendingJoin struct {
	entry command.JoinEntry
	done  chan struct{}
	res   command.TicketResult
	err   error
}

// Join gives user a place in sale sku's waiting room: a new ticket, or
// the one they hold (joined on any node), once committed. Joins from
// every buyer on this node share Join commands, as takes share Takes.
func (p *Plane) Join(ctx context.Context, sku, user string) (stock.SKU, stock.Ticket, error) {
	row, ok := p.queuedRow(ctx, sku)
	if !ok {
		return stock.SKU{}, stock.Ticket{}, fmt.Errorf("%w: %q", engine.ErrUnknownSKU, sku)
	}
	if row.Queue == nil {
		return row, stock.Ticket{}, fmt.Errorf("%w: %q sells to anyone: deduct without a ticket", ErrNotQueued, sku)
	}
	if t, ok, err := waitroom.OfUser(p.ledger.QueueRecords(), &row, user); err != nil || ok && t.State != stock.TicketExpired {
		return row, t, err // a repeat: the ticket they hold, whatever happened since
	}
	switch {
	case row.Closed():
		return row, stock.Ticket{}, fmt.Errorf("%w: %q", engine.ErrSaleClosed, sku)
	case row.Queue.SoldOutAtUnixNano != 0:
		return row, stock.Ticket{}, fmt.Errorf("%w: nothing can still be won from %q", ErrSoldOut, sku)
	case p.Engine.Closing():
		return row, stock.Ticket{}, fmt.Errorf("%w: node is shutting down", engine.ErrUnavailable)
	}
	var secret [command.JoinSecretBytes]byte
	rand.Read(secret[:])
	pj := &pendingJoin{entry: command.JoinEntry{SKU: sku, User: user, Secret: hex.EncodeToString(secret[:])}, done: make(chan struct{})}
	select {
	case p.joinQueue <- pj:
	default:
		return row, stock.Ticket{}, fmt.Errorf("%w: %d joins wait for the log on this node", ErrBusy, joinQueueMax)
	}
	ctx, cancel := context.WithTimeout(ctx, joinWaitMax)
	defer cancel()
	select {
	case <-pj.done:
	case <-ctx.Done():
		return row, stock.Ticket{}, fmt.Errorf("%w: the join did not commit within %s; join again (a repeat returns the same ticket)", engine.ErrOutcomeUnknown, joinWaitMax)
	case <-p.stop:
		return row, stock.Ticket{}, fmt.Errorf("%w: node stopped with the join queued; join again (a repeat returns the same ticket)", engine.ErrOutcomeUnknown)
	}
	if pj.err != nil {
		return row, stock.Ticket{}, pj.err
	}
	switch pj.res.Outcome {
	case stock.OutcomeOK, stock.OutcomeSame:
		p.queueMetrics.joins.Add(1)
		row, _, _ = p.ledger.SKU(sku)
		t, err := waitroom.Read(p.ledger.QueueRecords(), &row, pj.res.Joined)
		return row, t, err
	case stock.OutcomeUnknownSKU:
		return row, stock.Ticket{}, fmt.Errorf("%w: %q", engine.ErrUnknownSKU, sku)
	case stock.OutcomeNotQueued:
		return row, stock.Ticket{}, fmt.Errorf("%w: %q", ErrNotQueued, sku)
	case stock.OutcomeClosed:
		return row, stock.Ticket{}, fmt.Errorf("%w: %q", engine.ErrSaleClosed, sku)
	case stock.OutcomeSoldOut:
		return row, stock.Ticket{}, fmt.Errorf("%w: nothing can still be won from %q", ErrSoldOut, sku)
	}
	return row, stock.Ticket{}, fmt.Errorf("%w: join %s", engine.ErrInvalid, pj.res.Outcome)
}

// queuedRow reads sale sku's row, after a catch-up with the leader when
// this node does not know it yet (made through another node a moment ago).
func (p *Plane) queuedRow(ctx context.Context, sku string) (stock.SKU, bool) {
	row, _, ok := p.ledger.SKU(sku)
	if !ok && p.Engine.CatchUp(ctx) == nil {
		row, _, ok = p.ledger.SKU(sku)
	}
	return row, ok
}

// joiners batches queued joins into Join commands (batcher), with at
// most joinProposalsMax in flight.
func (p *Plane) joiners() *batcher.Batcher[*pendingJoin] {
	slots := make(chan struct{}, joinProposalsMax)
	return &batcher.Batcher[*pendingJoin]{
		Queue: p.joinQueue, Stop: p.stop, WG: &p.wg,
		Header:   command.JoinHeaderSize,
		Size:     func(j *pendingJoin) int { return j.entry.EncodedSize() },
		MaxItems: joinBatchMax, MaxBytes: p.cfg.TakeBatchBytesMax,
		Slots: func() chan struct{} { return slots },
		Abandon: func(j *pendingJoin) {
			j.finish(command.TicketResult{}, fmt.Errorf("%w: node is shutting down", engine.ErrUnavailable))
		},
		Commit: p.commitJoins,
	}
}

// commitJoins proposes one Join and answers its joiners once this node
// has applied it (a read here then sees their tickets).
func (p *Plane) commitJoins(batch []*pendingJoin) {
	c := &command.Join{Entries: make([]command.JoinEntry, len(batch))}
	for i, j := range batch {
		c.Entries[i] = j.entry
	}
	res, err := p.Engine.Propose(c)
	if err == nil && len(res.Tickets) != len(batch) {
		p.logger.Error("BUG: join results do not match the batch", "joins", len(batch), "results", len(res.Tickets))
		err = fmt.Errorf("%w: %d results for %d joins", engine.ErrOutcomeUnknown, len(res.Tickets), len(batch))
	}
	if err == nil {
		ctx, cancel := context.WithTimeout(p.stopped, joinWaitMax)
		err = p.ledger.WaitApplied(ctx, res.Index)
		cancel()
		if err != nil {
			err = fmt.Errorf("%w: joins committed, not yet applied here: %w", engine.ErrOutcomeUnknown, err)
		}
	}
	for i, j := range batch {
		var r command.TicketResult
		if err == nil {
			r = res.Tickets[i]
		}
		j.finish(r, err)
	}
}

func (j *pendingJoin) finish(r command.TicketResult, err error) {
	j.res, j.err = r, err
	close(j.done)
}

// Ticket reads the ticket whose secret is secret, with its sale's row:
// ok is false when there is none. With wait > 0 and the ticket waiting,
// it returns once the ticket's state or position changes (admitted, sold
// out, its place at the open), or wait (at most TicketWaitMax) has
// passed, or ctx ends; a ticket in any other state is answered at once.
//
// A ticket moves by the leader's tick (the open, admissions, expiries),
// not by a write someone was answered, so vouching (which holds such
// writes' answers) does not cover it: another node may already have
// shown a buyer the open that this one has not applied. Ticket catches up
// with the cluster before it reads (a ticket joined through another node
// a moment ago is found), and again after a long-poll waited, so no node
// shows a ticket behind what another already showed. It returns an
// ErrUnavailable when the node cannot catch up.
func (p *Plane) Ticket(ctx context.Context, secret string, wait time.Duration) (stock.SKU, stock.Ticket, bool, error) {
	if wait > 0 {
		// A long-poll waits from the moment it arrives: its watch is taken
		// before the catch-up, so a sell-out this node applies meanwhile
		// counts it among the long-polls it told (QueueApplied).
		if _, t, ok, err := p.readTicket(secret); err == nil && ok && t.State == stock.TicketWaiting {
			p.queueWatch(t.SKU, t.Position)
		}
	}
	if err := p.CatchUp(ctx); err != nil {
		return stock.SKU{}, stock.Ticket{}, false, err
	}
	row, t, ok, err := p.readTicket(secret)
	if err != nil || wait <= 0 || !ok || t.State != stock.TicketWaiting {
		return row, t, ok, err // only a waiting ticket is waited on: the others are acted on
	}
	p.awaitTicket(ctx, secret, &t, wait)
	if err := p.CatchUp(ctx); err != nil {
		return stock.SKU{}, stock.Ticket{}, false, err
	}
	return p.readTicket(secret)
}

// readTicket is Ticket's read of this node's ledger, at once.
func (p *Plane) readTicket(secret string) (stock.SKU, stock.Ticket, bool, error) {
	recs := p.ledger.QueueRecords()
	sku, n, ok, err := waitroom.Find(recs, secret)
	if err != nil || !ok {
		return stock.SKU{}, stock.Ticket{}, false, err
	}
	row, _, ok := p.ledger.SKU(sku)
	if !ok || row.Queue == nil || n > row.Queue.Joined {
		return stock.SKU{}, stock.Ticket{}, false, nil // the row trails the ticket's record for a moment
	}
	t, err := waitroom.Read(recs, &row, n)
	return row, t, err == nil, err
}

// awaitTicket returns once the waiting ticket first (of secret) may have
// changed state or position in this node's ledger, or wait (at most
// TicketWaitMax) has passed, or ctx ends, or the plane stops.
func (p *Plane) awaitTicket(ctx context.Context, secret string, first *stock.Ticket, wait time.Duration) {
	changed := func() bool {
		_, t, ok, err := p.readTicket(secret)
		return err != nil || !ok || t.State != first.State || t.Position != first.Position
	}
	// The channels are taken before the read: a change after it closes
	// one of them.
	all, mine := p.queueWatch(first.SKU, first.Position)
	if changed() {
		return
	}
	timer := time.NewTimer(min(wait, TicketWaitMax))
	defer timer.Stop()
	for {
		select {
		case <-all:
		case <-mine:
		case <-timer.C:
			return
		case <-ctx.Done():
			return
		case <-p.stop:
			return
		}
		all, mine = p.queueWatch(first.SKU, first.Position)
		if changed() {
			return
		}
	}
}

// queueWatchers are the long-polls of one queued sale: all is closed when
// every ticket may have changed (the open, sold out, units back, a
// restore), byPos[p] when position p was admitted or its admission
// expired. A poll re-reads its ticket when woken, so a wake too many
// costs a read; one too few cannot happen, as the channels are taken
// before the read.
type queueWatchers struct {
	all                     chan struct{}
	byPos                   map[int64]chan struct{}
	admitted, expired       int64 // the row's AdmittedThrough and ExpiredThrough when last seen
	opened, soldOut, closed bool
}

// queueWatch returns the channels a long-poll of a ticket at position
// pos (0: before the open) of sale sku waits on.
func (p *Plane) queueWatch(sku string, pos int64) (all, mine <-chan struct{}) {
	p.watchMu.Lock()
	defer p.watchMu.Unlock()
	w := p.watch[sku]
	if w == nil {
		w = &queueWatchers{all: make(chan struct{}), byPos: map[int64]chan struct{}{}}
		if row, _, ok := p.ledger.SKU(sku); ok && row.Queue != nil {
			w.see(&row)
		}
		p.watch[sku] = w
	}
	if pos == 0 {
		return w.all, nil
	}
	ch := w.byPos[pos]
	if ch == nil {
		ch = make(chan struct{})
		w.byPos[pos] = ch
	}
	return w.all, ch
}

// see records what the watchers last saw of the row.
func (w *queueWatchers) see(row *stock.SKU) {
	q := row.Queue
	w.admitted, w.expired, w.opened, w.soldOut, w.closed = q.AdmittedThrough, q.ExpiredThrough, q.Opened(), q.SoldOutAtUnixNano != 0, row.Closed()
}

// QueueApplied wakes the long-polls whose tickets the ledger's events
// may have changed (raftfsm.Observer's Applied, beside the engine's): on
// the FSM goroutine, a row read and a close per ticket admitted or
// expired.
func (p *Plane) QueueApplied(events []raftfsm.Event) {
	p.watchMu.Lock()
	defer p.watchMu.Unlock()
	for _, ev := range events {
		if ev.Kind == raftfsm.EventReplaced {
			for sku, w := range p.watch {
				w.wakeAll()
				delete(p.watch, sku)
			}
			continue
		}
		if ev.Kind != raftfsm.EventQueueChanged {
			continue
		}
		row, _, ok := p.ledger.SKU(ev.SKU)
		if !ok || row.Queue == nil {
			continue
		}
		q := row.Queue
		p.noteAdmitted(&row)
		w := p.watch[ev.SKU]
		if w == nil {
			continue
		}
		// Noted once a sell-out, whether or not the watchers saw it: a
		// long-poll that caught up with the cluster just before this call
		// may have made them from the row already sold out.
		if q.SoldOutAtUnixNano != 0 {
			p.queueMetrics.noteTold(ev.SKU, q.SoldOutAtUnixNano, p.cfg.Now().Sub(time.Unix(0, q.SoldOutAtUnixNano)))
		}
		if q.Opened() != w.opened || (q.SoldOutAtUnixNano != 0) != w.soldOut || row.Closed() != w.closed {
			w.wakeAll()
			delete(p.watch, ev.SKU) // the next long-poll starts afresh
			continue
		}
		for _, span := range [][2]int64{{w.admitted, q.AdmittedThrough}, {w.expired, q.ExpiredThrough}} {
			for pos := span[0] + 1; pos <= span[1]; pos++ {
				if ch := w.byPos[pos]; ch != nil {
					close(ch)
					delete(w.byPos, pos)
				}
			}
		}
		w.see(&row)
	}
}

func (w *queueWatchers) wakeAll() {
	close(w.all)
	for _, ch := range w.byPos {
		close(ch)
	}
}
