package control

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"stockd.dev/stockd/engine"
	"stockd.dev/stockd/raftfsm"
	"stockd.dev/stockd/stock"
)

// countingCluster is a one-node cluster that counts the quorum catch-ups
// (ReadIndex) asked of it and can lose its leader.
type countingCluster struct {
	rounds atomic.Int64
	lost   atomic.Bool
}

func (c *countingCluster) IsLeader() bool                    { return true }
func (c *countingCluster) CommitHealthy() bool               { return true }
func (c *countingCluster) Unreachable() map[string]time.Time { return nil }
func (c *countingCluster) MemberIDs() ([]string, error)      { return []string{"n1"}, nil }
func (c *countingCluster) VotersKnowRules(uint64) bool       { return true }

// LeaseReadIndex is not counted: vouching's rounds are not the ticket's.
func (c *countingCluster) LeaseReadIndex(ctx context.Context) (uint64, error) { return 0, nil }

// ReadIndex: alone, the node's own ledger holds every write.
func (c *countingCluster) ReadIndex(context.Context) (uint64, error) {
	c.rounds.Add(1)
	if c.lost.Load() {
		return 0, errors.New("no leader")
	}
	return 0, nil
}

// joinBeforeTheOpen creates queued sale sku of total units opening in an
// hour, once the ledger runs the current rules, and returns user's ticket
// in its waiting room.
func joinBeforeTheOpen(t *testing.T, tn *testNode, sku string, total int64, user string) stock.Ticket {
	t.Helper()
	waitUntil(t, "the ledger runs the current rules", func() bool { return tn.ledger.Rules() == raftfsm.RulesCurrent })
	if _, err := tn.plane.CreateSale(sku, SaleSpec{Total: total, Queue: true, StartAt: time.Now().Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	_, tk, err := tn.plane.Join(context.Background(), sku, user)
	if err != nil {
		t.Fatal(err)
	}
	if tk.State != stock.TicketWaiting || tk.Position != 0 {
		t.Fatalf("%s joined before the open: %+v, want waiting at position 0", user, tk)
	}
	return tk
}

// TestPlane_TicketCatchesUpBeforeItReadsAndAgainOnlyAfterItWaited: a
// ticket moves by the leader's tick, which vouching does not cover, so a
// read of one catches up with the cluster first (one round), a long-poll
// that waited catches up again before it answers (two), and a node that
// cannot catch up answers unavailable, not its own view.
func TestPlane_TicketCatchesUpBeforeItReadsAndAgainOnlyAfterItWaited(t *testing.T) {
	cluster := &countingCluster{}
	tn := startTestNode(t, t.TempDir(), func(c *engine.Config) { c.Cluster = cluster })
	p := tn.plane
	ctx := context.Background()
	joined := joinBeforeTheOpen(t, tn, "q", 10, "alice")
	read := func(secret string, wait time.Duration) (stock.Ticket, bool, int64, error) {
		t.Helper()
		before := cluster.rounds.Load()
		_, tk, ok, err := p.Ticket(ctx, secret, wait)
		return tk, ok, cluster.rounds.Load() - before, err
	}

	tk, ok, rounds, err := read(joined.Secret, 0)
	if err != nil || !ok || tk.State != stock.TicketWaiting || tk.JoinedIndex != joined.JoinedIndex {
		t.Fatalf("read at once: %+v ok=%v err=%v, want alice's waiting ticket", tk, ok, err)
	}
	if rounds != 1 {
		t.Fatalf("a read at once took %d catch-up rounds, want 1", rounds)
	}
	tk, ok, rounds, err = read(joined.Secret, 30*time.Millisecond)
	if err != nil || !ok || tk.State != stock.TicketWaiting {
		t.Fatalf("long-poll until its wait ran out: %+v ok=%v err=%v, want still waiting", tk, ok, err)
	}
	if rounds != 2 {
		t.Fatalf("a long-poll that waited took %d catch-up rounds, want 2 (before the read, after the wait)", rounds)
	}
	if _, ok, rounds, err = read("00ff", time.Minute); err != nil || ok || rounds != 1 {
		t.Fatalf("a long-poll of no ticket: ok=%v err=%v after %d rounds, want not found at once after 1", ok, err, rounds)
	}

	// A ticket not waiting is answered at once, after one round, whatever
	// wait asks for.
	if _, err := p.CreateSale("open", SaleSpec{Total: 10, Queue: true}); err != nil {
		t.Fatal(err)
	}
	_, bob, err := p.Join(ctx, "open", "bob")
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "bob admitted", func() bool {
		_, tk, _, err := p.Ticket(ctx, bob.Secret, 0)
		return err == nil && tk.State == stock.TicketAdmitted
	})
	if tk, ok, rounds, err = read(bob.Secret, time.Minute); err != nil || !ok || tk.State != stock.TicketAdmitted || rounds != 1 {
		t.Fatalf("a long-poll of an admitted ticket: %+v ok=%v err=%v after %d rounds, want admitted at once after 1", tk, ok, err, rounds)
	}

	cluster.lost.Store(true)
	if _, ok, _, err = read(joined.Secret, 0); !errors.Is(err, engine.ErrUnavailable) || ok {
		t.Fatalf("a node that cannot catch up: ok=%v err=%v, want ErrUnavailable", ok, err)
	}
}

// TestPlane_ASellOutIsNotedOnceWhenLongPollsWait: the operator's page
// shows how long a node took to tell its waiting long-polls of a sell-out.
// It is noted when the sell-out applies with long-polls waiting, even ones
// that were made from the row already sold out (a long-poll that caught
// up just before the entry's observer ran), once a sell-out: a later
// change of the same sold-out sale leaves the figure alone, and a sale
// sold out again (restocked between) is noted afresh.
func TestPlane_ASellOutIsNotedOnceWhenLongPollsWait(t *testing.T) {
	var rows *soldOutOverlay
	base := time.Now().UnixNano()
	var now atomic.Int64
	now.Store(base)
	tune := func(c *engine.Config) { c.Now = func() time.Time { return time.Unix(0, now.Load()) } }
	tn := startTestNodeWrapped(t, t.TempDir(), tune, func(l *raftfsm.Ledger) Ledger {
		rows = &soldOutOverlay{Ledger: l}
		return rows
	})
	p := tn.plane
	joinBeforeTheOpen(t, tn, "q", 1, "dave")
	at := func(d time.Duration) int64 { return base + int64(d) }
	changed := []raftfsm.Event{{Kind: raftfsm.EventQueueChanged, SKU: "q"}}
	told := func() (float64, bool) {
		s, ok := p.QueueCounters().SoldOutTold["q"]
		return s, ok
	}

	rows.soldOutAt.Store(at(10 * time.Second))
	now.Store(at(10*time.Second + 250*time.Millisecond))
	p.QueueApplied(changed)
	if s, ok := told(); ok {
		t.Fatalf("a sell-out with no long-poll waiting was noted (%.3fs)", s)
	}
	p.queueWatch("q", 0) // made from the row already sold out
	p.QueueApplied(changed)
	if s, ok := told(); !ok || s != 0.25 {
		t.Fatalf("a sell-out with a long-poll waiting: noted=%v %.3fs, want 0.250s", ok, s)
	}
	now.Store(at(40 * time.Second))
	p.queueWatch("q", 0)
	p.QueueApplied(changed)
	if s, _ := told(); s != 0.25 {
		t.Fatalf("the same sell-out applied again moved the figure to %.3fs, want 0.250s", s)
	}
	rows.soldOutAt.Store(at(39 * time.Second))
	p.queueWatch("q", 0)
	p.QueueApplied(changed)
	if s, _ := told(); s != 1 {
		t.Fatalf("a second sell-out noted %.3fs, want 1.000s", s)
	}
}

// heldCluster is countingCluster whose quorum catch-ups, once armed,
// report that they began (entered) and wait for release.
type heldCluster struct {
	countingCluster
	armed   atomic.Bool
	entered chan struct{}
	release chan struct{}
}

func (c *heldCluster) ReadIndex(ctx context.Context) (uint64, error) {
	if c.armed.CompareAndSwap(true, false) {
		c.entered <- struct{}{}
		<-c.release
	}
	return c.countingCluster.ReadIndex(ctx)
}

// soldOutOverlay is a ledger whose sale "q" reads as sold out at
// soldOutAt once that is set.
type soldOutOverlay struct {
	Ledger
	soldOutAt atomic.Int64
}

func (l *soldOutOverlay) SKU(sku string) (stock.SKU, uint64, bool) {
	row, v, ok := l.Ledger.SKU(sku)
	if at := l.soldOutAt.Load(); ok && sku == "q" && at != 0 && row.Queue != nil {
		q := *row.Queue
		q.SoldOutAtUnixNano = at
		row.Queue = &q
	}
	return row, v, ok
}

// TestPlane_ALongPollWaitsFromItsArrival: a long-poll that arrived and is
// still catching up with the cluster when the sell-out applies is one of
// the long-polls the node told: the operator's page shows the time, and
// the long-poll answers sold out.
func TestPlane_ALongPollWaitsFromItsArrival(t *testing.T) {
	cluster := &heldCluster{entered: make(chan struct{}), release: make(chan struct{})}
	var rows *soldOutOverlay
	tn := startTestNodeWrapped(t, t.TempDir(), func(c *engine.Config) { c.Cluster = cluster }, func(l *raftfsm.Ledger) Ledger {
		rows = &soldOutOverlay{Ledger: l}
		return rows
	})
	p := tn.plane
	ctx := context.Background()
	dave := joinBeforeTheOpen(t, tn, "q", 1, "dave")

	cluster.armed.Store(true)
	type answer struct {
		t   stock.Ticket
		err error
	}
	answered := make(chan answer, 1)
	go func() {
		_, tk, _, err := p.Ticket(ctx, dave.Secret, 5*time.Second)
		answered <- answer{tk, err}
	}()
	select {
	case <-cluster.entered:
	case <-time.After(5 * time.Second):
		t.Fatal("the long-poll did not start catching up in 5 s")
	}
	rows.soldOutAt.Store(time.Now().Add(-100 * time.Millisecond).UnixNano())
	p.QueueApplied([]raftfsm.Event{{Kind: raftfsm.EventQueueChanged, SKU: "q"}})
	close(cluster.release)
	a := <-answered
	if a.err != nil || a.t.State != stock.TicketSoldOut {
		t.Fatalf("the long-poll after the sell-out: %+v %v, want sold out", a.t, a.err)
	}
	if s, ok := p.QueueCounters().SoldOutTold["q"]; !ok || s < 0.1 {
		t.Fatalf("the node told a long-poll of the sell-out and noted %v (%v), want about 0.1 s", s, ok)
	}
}
