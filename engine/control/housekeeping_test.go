package control

import (
	"stockd.dev/stockd/stock"
	"testing"
	"time"
)

// TestAuditDrift_CountsArchivedOrdersByTheirUnits: an archived sale's sold
// orders have left the ledger and count by ArchivedSold, as the ledger's
// audit counts them; a unit missing anywhere is drift.
func TestAuditDrift_CountsArchivedOrdersByTheirUnits(t *testing.T) {
	f := func(a stock.Audit, want int64) {
		t.Helper()
		if got := auditDrift(&a); got != want {
			t.Fatalf("drift of %+v: %d, want %d", a, got, want)
		}
	}
	row := stock.SKU{Total: 100, Sold: 100}
	f(stock.Audit{Row: row, OrdersSold: 100}, 0)
	archived := row
	archived.ArchivedSold = 100
	f(stock.Audit{Row: archived}, 0)
	half := row
	half.ArchivedSold = 60
	f(stock.Audit{Row: half, OrdersSold: 40}, 0)
	f(stock.Audit{Row: half, OrdersSold: 39}, 1)
	f(stock.Audit{Row: stock.SKU{Total: 100, Sold: 99}, OrdersSold: 99}, 1)
}

// TestAuditDue_HeldBackWhileSelling: the periodic audit starts once its
// gap has passed, unless the node is busy selling; then it waits, up to
// auditHoldMax past its time.
func TestAuditDue_HeldBackWhileSelling(t *testing.T) {
	gap := 30 * time.Second
	for _, c := range []struct {
		sinceLast time.Duration
		busy      bool
		want      bool
	}{
		{gap - time.Second, false, false},
		{gap - time.Second, true, false},
		{gap, false, true},
		{gap, true, false},
		{gap + auditHoldMax - time.Second, true, false},
		{gap + auditHoldMax, true, true},
		{time.Duration(1<<63 - 1), true, true}, // no audit yet: the first runs at once
	} {
		if got := auditDue(c.sinceLast, gap, c.busy); got != c.want {
			t.Errorf("auditDue(%s since the last, gap %s, busy %v) = %v, want %v", c.sinceLast, gap, c.busy, got, c.want)
		}
	}
}

// TestSellingRate_BusyAtTheHoldRate: a node is busy selling while it
// answers auditHoldRate or more a second, measured over a second or more.
func TestSellingRate_BusyAtTheHoldRate(t *testing.T) {
	var r sellingRate
	t0 := time.Unix(1000, 0)
	steps := []struct {
		after    time.Duration
		answered uint64
		want     bool
	}{
		{0, 0, false}, // the first reading
		{500 * time.Millisecond, 5 * auditHoldRate, false}, // under a second: not measured yet
		{time.Second, 5 * auditHoldRate, true},
		{2 * time.Second, 5*auditHoldRate + auditHoldRate - 1, false}, // one short of the rate
		{4 * time.Second, 5*auditHoldRate + 3*auditHoldRate, true},    // over two seconds
		{5 * time.Second, 5*auditHoldRate + 3*auditHoldRate, false},   // the sale is over
	}
	for _, s := range steps {
		if got := r.busy(s.answered, t0.Add(s.after)); got != s.want {
			t.Fatalf("at +%s with %d answered: busy %v, want %v", s.after, s.answered, got, s.want)
		}
	}
}

// TestAuditGap_PacedByTheAuditsOwnCost: the periodic audit recounts every
// order, so its cost grows with the ledger; the next one waits a hundred
// times the last one's duration when that is longer than AuditInterval,
// keeping the recount under a hundredth of a core.
func TestAuditGap_PacedByTheAuditsOwnCost(t *testing.T) {
	interval := 30 * time.Second
	if got := auditGapAfter(interval, 0); got != 30*time.Second {
		t.Fatalf("before any audit: %s", got)
	}
	if got := auditGapAfter(interval, 200*time.Millisecond); got != 30*time.Second { // a small ledger
		t.Fatalf("after a 200ms audit: %s, want the interval", got)
	}
	if got := auditGapAfter(interval, 4*time.Second); got != 400*time.Second { // ten million orders
		t.Fatalf("after a 4s audit: %s, want 400s", got)
	}
}
