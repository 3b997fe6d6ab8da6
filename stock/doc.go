// Package stock holds the domain types every layer of stockd speaks: a
// sale's row of the ledger and its configuration, orders and their states,
// the ledger's outcomes, lottery entries, the order feed's events and
// cursors, and audits. It has no behaviour beyond what the types' own
// invariants need (the conservation law, a cursor's wire form), imports
// nothing of the project, and is what the ledger (raftfsm), the engine and
// the HTTP layer pass between them.
package stock
