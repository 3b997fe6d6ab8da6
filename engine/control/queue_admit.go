package control

import (
	"crypto/rand"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"stockd.dev/stockd/engine"
	"stockd.dev/stockd/internal/queuetoken"
	"stockd.dev/stockd/raftfsm/command"
	"stockd.dev/stockd/raftfsm/waitroom"
	"stockd.dev/stockd/stock"
)

const (
	// admitPerTickMin is the fewest admissions one tick of the leader's
	// loop may issue; past it the adaptive admission limit (the deducts the
	// ledger commits within its latency target at once) paces them.
	admitPerTickMin = 64
	// QueueKeyRotateEvery is how old a queued sale's signing key grows
	// before the leader rotates it.
	QueueKeyRotateEvery = 24 * time.Hour
)

// queueMetrics are the waiting room's counters on this node.
type queueMetrics struct {
	joins    atomic.Uint64 // joins answered (new tickets and repeats)
	admitted atomic.Uint64 // admissions this node proposed as leader
	mu       sync.Mutex
	// toldSeconds is, per sale, how long after the entry that sold its
	// last unit this node woke every waiting ticket's long-poll.
	toldSeconds map[string]float64
	// toldFor is, per sale, the sell-out (its SoldOutAtUnixNano) whose
	// telling toldSeconds holds: each sell-out is noted once.
	toldFor map[string]int64
}

// QueueCounters are the waiting room's counters for the metrics page.
type QueueCounters struct {
	Joins, Admitted uint64
	SoldOutTold     map[string]float64 // seconds, by sale
}

// QueueCounters reads the waiting room's counters.
func (p *Plane) QueueCounters() QueueCounters {
	m := &p.queueMetrics
	m.mu.Lock()
	defer m.mu.Unlock()
	told := make(map[string]float64, len(m.toldSeconds))
	for k, v := range m.toldSeconds {
		told[k] = v
	}
	return QueueCounters{Joins: m.joins.Load(), Admitted: m.admitted.Load(), SoldOutTold: told}
}

func (m *queueMetrics) noteTold(sku string, soldOutAt int64, d time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.toldSeconds == nil {
		m.toldSeconds, m.toldFor = map[string]float64{}, map[string]int64{}
	}
	if m.toldFor[sku] == soldOutAt {
		return
	}
	m.toldSeconds[sku], m.toldFor[sku] = d.Seconds(), soldOutAt
}

// tickQueues is the leader's part of every queued sale, once a loop
// tick: the open when start_at has passed, the expiry of admissions that
// ran out, admissions while the bound allows (paced by the adaptive
// admission limit), and a key rotation a day. Proposals run off the loop,
// one round at a time.
func (p *Plane) tickQueues(now time.Time) {
	perTick := int64(admitPerTickMin)
	if s := p.Engine.MetricsSnapshot(); s.AdmissionAdaptive {
		perTick = max(perTick, s.AdmissionLimit)
	}
	p.admitPerTick.Store(perTick) // for the ETAs, on every node
	if !p.Engine.IsLeader() || !p.queueing.CompareAndSwap(false, true) {
		return
	}
	rows, _ := p.ledger.SKUs()
	var due []command.Command
	for i := range rows {
		r := &rows[i]
		if r.Queue == nil || r.Closed() {
			continue
		}
		if c := p.queueTickFor(r, now, perTick); c != nil {
			due = append(due, c)
		}
		if keys := r.Queue.Keys; now.UnixNano()-keys[len(keys)-1].AddedUnixNano >= int64(QueueKeyRotateEvery) {
			due = append(due, newKeyCommand(r.SKU))
		}
	}
	if len(due) == 0 {
		p.queueing.Store(false)
		return
	}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		defer p.queueing.Store(false)
		for _, c := range due {
			res, err := p.Engine.Propose(c)
			switch {
			case err != nil:
				p.logger.Warn("waiting room: proposal failed; the next tick tries again", "op", c.Op(), "err", err)
				return
			case res.Outcome != stock.OutcomeOK:
				p.logger.Warn("waiting room: proposal refused", "op", c.Op(), "outcome", res.Outcome, "detail", res.Detail)
			case c.Op() == command.OpQueueTick && res.Qty > 0:
				p.queueMetrics.admitted.Add(uint64(res.Qty))
			case c.Op() == command.OpRotateQueueKey:
				p.logger.Info("waiting room: signing key rotated", "sku", c.(*command.RotateQueueKey).SKU)
			}
		}
	}()
}

// queueTickFor is the QueueTick sale r needs now (nil: none).
func (p *Plane) queueTickFor(r *stock.SKU, now time.Time, perTick int64) *command.QueueTick {
	q := r.Queue
	if !q.Opened() {
		if now.UnixNano() >= r.Config.StartAtUnixNano {
			return &command.QueueTick{SKU: r.SKU, Through: perTick} // the open, and its first admissions
		}
		return nil
	}
	if q.SoldOutAtUnixNano != 0 {
		return nil // nothing moves until a restock
	}
	room := waitroom.Bound(r) - q.Outstanding
	// Through caps the tick at perTick admissions; the ledger admits only
	// what its bound allows once the tick's expiries are done, so a wave
	// that an expiry makes room for comes in with it, in one entry.
	tick := &command.QueueTick{SKU: r.SKU, Through: q.AdmittedThrough + perTick}
	if room > 0 && q.AdmittedThrough < q.Joined {
		return tick
	}
	if q.ExpiredThrough < q.AdmittedThrough {
		// The oldest admission not yet processed: bought, or run out.
		t, err := waitroom.AtPosition(p.ledger.QueueRecords(), r, q.ExpiredThrough+1)
		if err == nil && (t.State != stock.TicketAdmitted || t.AdmittedUntilUnixNano <= now.UnixNano()) {
			return tick
		}
	}
	return nil
}

func newKeyCommand(sku string) *command.RotateQueueKey {
	key := make([]byte, queuetoken.KeySize)
	rand.Read(key)
	return &command.RotateQueueKey{SKU: sku, Key: key}
}

// RotateQueueKey makes a new signing key current for queued sale sku's
// tokens (an operator's call): tokens signed by the key before the
// current one stop verifying.
func (p *Plane) RotateQueueKey(sku string) error {
	res, err := p.Engine.Propose(newKeyCommand(sku))
	if err != nil {
		return err
	}
	switch res.Outcome {
	case stock.OutcomeOK:
		return nil
	case stock.OutcomeUnknownSKU:
		return fmt.Errorf("%w: %q", engine.ErrUnknownSKU, sku)
	case stock.OutcomeNotQueued:
		return fmt.Errorf("%w: %q", ErrNotQueued, sku)
	}
	return fmt.Errorf("%w: rotate %s", engine.ErrInvalid, res.Outcome)
}

// QueueView is a queued sale's waiting room as GET /v1/skus/{sku}/queue
// shows it.
type QueueView struct {
	Waiting             int64
	AdmittedOutstanding int64
	AdmittedTotal       int64
	Bought              int64
	Expired             int64
	SoldOutTold         int64
	// CutoffPosition is the last position that can still win as the
	// ledger stands: those admitted, then as many as the units not
	// covered by tokens out (0 once sold out).
	CutoffPosition int64
	Bound          int64
	Row            stock.SKU
}

// Queue reads sale sku's waiting room (ok false: no such sale).
func (p *Plane) Queue(sku string) (QueueView, bool, error) {
	row, _, ok := p.ledger.SKU(sku)
	if !ok {
		return QueueView{}, false, nil
	}
	q := row.Queue
	if q == nil {
		return QueueView{Row: row}, true, fmt.Errorf("%w: %q", ErrNotQueued, sku)
	}
	v := QueueView{AdmittedOutstanding: q.Outstanding, AdmittedTotal: q.AdmittedTotal, Bought: q.Bought,
		Expired: q.Expired, Bound: waitroom.Bound(&row), Row: row}
	if q.SoldOutAtUnixNano != 0 {
		// The tickets admitted and unused read sold_out, like the rest.
		v.SoldOutTold, v.AdmittedOutstanding = q.Joined-q.Bought-q.Expired, 0
	} else {
		v.Waiting = q.Joined - q.AdmittedThrough
		v.CutoffPosition = min(q.Joined, q.AdmittedThrough+max(0, row.Remaining()-q.Outstanding))
	}
	return v, true, nil
}

// QueueTickets calls fn for every ticket of queued sale sku in line order
// (join order before the open), from this node's ledger as it stands.
func (p *Plane) QueueTickets(sku string, fn func(*stock.Ticket) error) error {
	row, _, ok := p.ledger.SKU(sku)
	switch {
	case !ok:
		return fmt.Errorf("%w: %q", engine.ErrUnknownSKU, sku)
	case row.Queue == nil:
		return fmt.Errorf("%w: %q", ErrNotQueued, sku)
	}
	return waitroom.Each(p.ledger.QueueRecords(), &row, fn)
}

// TicketToken is the admission token of ticket t of queued sale row, as
// every node computes it ("" unless it is admitted and its key verifies).
func TicketToken(row *stock.SKU, t *stock.Ticket) string { return waitroom.Token(row, t) }
