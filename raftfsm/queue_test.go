package raftfsm

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/hashicorp/raft"

	"stockd.dev/stockd/raftfsm/command"
	"stockd.dev/stockd/raftfsm/waitroom"
	"stockd.dev/stockd/stock"
)

// applyAt applies typed command c proposed at at as the next entry.
func (t *testLedger) applyAt(at int64, c command.Command) *command.Result {
	t.tb.Helper()
	t.index++
	res, _ := t.l.Apply(&raft.Log{Index: t.index, Term: 1, Type: raft.LogCommand, Data: command.EncodeCommand(nil, at, c)}).(*command.Result)
	if res == nil {
		t.tb.Fatalf("apply %s at %d: no result", c.Op(), t.index)
	}
	return res
}

func joinSecret(user string) string { return fmt.Sprintf("%032x", []byte(user)) }

// ticketOf reads the ticket of secret as a node's reads do.
func ticketOf(l *Ledger, secret string) (stock.Ticket, bool, error) {
	sku, n, ok, err := waitroom.Find(l.QueueRecords(), secret)
	if err != nil || !ok {
		return stock.Ticket{}, false, err
	}
	row, _, _ := l.SKU(sku)
	t, err := waitroom.Read(l.QueueRecords(), &row, n)
	return t, err == nil, err
}

// TestLedger_QueuedSaleSellsOnlyToAdmittedTickets: a queued sale needs
// the waiting room's rules; its joins give one ticket a user; the open
// and admissions come with a QueueTick, under the bound; a take needs an
// admitted ticket of its user, once; when the last unit sells every
// ticket not bought reads sold_out, from that entry's time; all of it
// survives a reopen, and the law holds.
func TestLedger_QueuedSaleSellsOnlyToAdmittedTickets(t *testing.T) {
	tl := newTestLedger(t)
	const start = int64(1_900_000_000_000_000_000)
	cfg := stock.SaleConfig{Total: 3, StartAtUnixNano: start, Admission: stock.AdmissionQueue}
	create := &command.CreateSale{SKU: "q", Sale: cfg, Secret: bytes.Repeat([]byte{9}, waitroom.SecretBytes)}
	if r := tl.applyAt(1, create); r.Outcome != stock.OutcomeInvalid {
		t.Fatalf("a queued sale under rules %d: %v", tl.l.Rules(), r.Outcome)
	}
	tl.applyAt(1, &command.SetRules{Rules: RulesWaitingRoom})
	if r := tl.applyAt(2, create); r.Outcome != stock.OutcomeOK {
		t.Fatalf("create: %v %s", r.Outcome, r.Detail)
	}
	var join command.Join
	for i := range 6 {
		join.Entries = append(join.Entries, command.JoinEntry{SKU: "q", User: fmt.Sprintf("u%d", i), Secret: joinSecret(fmt.Sprintf("u%d", i))})
	}
	join.Entries = append(join.Entries, command.JoinEntry{SKU: "q", User: "u0", Secret: joinSecret("again")})
	r := tl.applyAt(start-10, &join)
	for i, tr := range r.Tickets {
		want := command.TicketResult{Outcome: stock.OutcomeOK, Joined: int64(i) + 1}
		if i == 6 {
			want = command.TicketResult{Outcome: stock.OutcomeSame, Joined: 1}
		}
		if tr != want {
			t.Fatalf("join %d: %+v, want %+v", i, tr, want)
		}
	}
	if r := tl.applyAt(start, &command.QueueTick{SKU: "q", Through: 100}); r.Outcome != stock.OutcomeOK || r.Qty != 4 {
		t.Fatalf("tick at the open: %v admitted %d, want 4 = ceil(1.2 x 3)", r.Outcome, r.Qty)
	}
	byPos := map[int64]stock.Ticket{}
	for i := range 6 {
		tk, ok, err := ticketOf(tl.l, joinSecret(fmt.Sprintf("u%d", i)))
		if err != nil || !ok || tk.Position < 1 || tk.Position > 6 {
			t.Fatalf("u%d's ticket: %+v %v %v", i, tk, ok, err)
		}
		byPos[tk.Position] = tk
	}
	if len(byPos) != 6 || byPos[4].State != stock.TicketAdmitted || byPos[5].State != stock.TicketWaiting {
		t.Fatalf("positions %v", byPos)
	}
	tl.applyAt(start+1, &command.Lease{Node: "n1", SKU: "q", Want: 3})
	takeOf := func(p int64, ticket *stock.Ticket, order string) *command.Take {
		e := command.TakeEntry{SKU: "q", Qty: 1, User: byPos[p].User, OrderID: order}
		if ticket != nil {
			e.Ticket = string(ticket.ID[:])
		}
		return &command.Take{Node: "n1", Entries: []command.TakeEntry{e}}
	}
	first, fifth := byPos[1], byPos[5]
	for _, c := range []struct {
		name string
		take *command.Take
		want stock.Outcome
	}{
		{"no ticket", takeOf(2, nil, "n1-1-a"), stock.OutcomeAdmissionRequired},
		{"not admitted", takeOf(5, &fifth, "n1-2-a"), stock.OutcomeAdmissionInvalid},
		{"another user's", takeOf(2, &first, "n1-3-a"), stock.OutcomeAdmissionInvalid},
		{"its own", takeOf(1, &first, "n1-4-a"), stock.OutcomeOK},
		{"spent", takeOf(1, &first, "n1-5-a"), stock.OutcomeAdmissionInvalid},
	} {
		if r := tl.applyAt(start+2, c.take); r.Takes[0].Outcome != c.want {
			t.Fatalf("%s: %v, want %v", c.name, r.Takes[0].Outcome, c.want)
		}
	}
	second, third := byPos[2], byPos[3]
	tl.applyAt(start+3, takeOf(2, &second, "n1-6-a"))
	tl.applyAt(start+4, &command.Restock{SKU: "q", Qty: 0}) // refused: an entry between the two last takes
	tl.applyAt(start+5, takeOf(3, &third, "n1-7-a"))
	row := tl.row("q")
	if row.Sold != 3 || row.Queue.Bought != 3 || row.Queue.SoldOutAtUnixNano != start+5 {
		t.Fatalf("after the last unit: %+v %+v", row, *row.Queue)
	}
	checkAudit(t, tl.l, "q")
	if err := tl.l.Close(); err != nil {
		t.Fatal(err)
	}
	l2, err := OpenLedger(tl.dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l2.Close()
	for p, want := range map[int64]string{1: stock.TicketBought, 3: stock.TicketBought, 4: stock.TicketSoldOut, 6: stock.TicketSoldOut} {
		if tk, ok, err := ticketOf(l2, byPos[p].Secret); err != nil || !ok || tk.State != want || tk.Position != p {
			t.Fatalf("after a reopen position %d reads %+v %v %v, want %s", p, tk, ok, err, want)
		}
	}
	checkAudit(t, l2, "q")
}
