package engine

import (
	"testing"

	"stockd/raftfsm"
)

// TestAuditDrift_CountsArchivedOrdersByTheirUnits: an archived sale's sold
// orders have left the ledger and count by ArchivedSold, as the ledger's
// audit counts them; a unit missing anywhere is drift.
func TestAuditDrift_CountsArchivedOrdersByTheirUnits(t *testing.T) {
	f := func(a raftfsm.Audit, want int64) {
		t.Helper()
		if got := auditDrift(&a); got != want {
			t.Fatalf("drift of %+v: %d, want %d", a, got, want)
		}
	}
	row := raftfsm.SKU{Total: 100, Sold: 100}
	f(raftfsm.Audit{Row: row, OrdersSold: 100}, 0)
	archived := row
	archived.ArchivedSold = 100
	f(raftfsm.Audit{Row: archived}, 0)
	half := row
	half.ArchivedSold = 60
	f(raftfsm.Audit{Row: half, OrdersSold: 40}, 0)
	f(raftfsm.Audit{Row: half, OrdersSold: 39}, 1)
	f(raftfsm.Audit{Row: raftfsm.SKU{Total: 100, Sold: 99}, OrdersSold: 99}, 1)
}
