package waitroom

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"stockd.dev/stockd/internal/queuetoken"
	"stockd.dev/stockd/raftfsm/command"
	"stockd.dev/stockd/stock"
)

// memTxn is a Txn over maps, at a time the test sets.
type memTxn struct {
	buckets map[string]map[string][]byte
	at      int64
}

func newTxn() *memTxn { return &memTxn{buckets: map[string]map[string][]byte{}} }

func (m *memTxn) Get(bucket, key []byte) ([]byte, error) {
	return m.buckets[string(bucket)][string(key)], nil
}

func (m *memTxn) Put(bucket, key, value []byte) {
	b := m.buckets[string(bucket)]
	if b == nil {
		b = map[string][]byte{}
		m.buckets[string(bucket)] = b
	}
	b[string(key)] = value
}

func (m *memTxn) At() int64 { return m.at }

const start = int64(1_900_000_000_000_000_000)

func queuedSale(sku string, total int64) *stock.SKU {
	secret := bytes.Repeat([]byte{byte(len(sku))}, SecretBytes)
	secret[0] = 7
	return &stock.SKU{SKU: sku, Total: total, Available: total, Queue: New(secret, 0),
		Config: stock.SaleConfig{Total: total, StartAtUnixNano: start, Admission: stock.AdmissionQueue, QueueAdmitTTLNanos: int64(time.Minute)}}
}

func secretOf(user string) string { return fmt.Sprintf("%032x", []byte(user)) }

func join(t *testing.T, tx Txn, s *stock.SKU, user string) (stock.Outcome, stock.Ticket) {
	t.Helper()
	o, tk, err := Join(tx, s, &command.JoinEntry{SKU: s.SKU, User: user, Secret: secretOf(user)})
	if err != nil {
		t.Fatal(err)
	}
	return o, tk
}

// TestJoin_OnePlacePerUser: a user's second join answers their first
// ticket; bad joins are refused.
func TestJoin_OnePlacePerUser(t *testing.T) {
	tx, s := newTxn(), queuedSale("phone", 10)
	o1, a := join(t, tx, s, "alice")
	o2, again := join(t, tx, s, "alice")
	_, b := join(t, tx, s, "bob")
	if o1 != stock.OutcomeOK || o2 != stock.OutcomeSame || again.ID != a.ID || again.Secret != a.Secret || b.JoinedIndex != 2 || s.Queue.Joined != 2 {
		t.Fatalf("alice %v %+v, again %v %+v, bob %+v, joined %d", o1, a, o2, again, b, s.Queue.Joined)
	}
	if a.Position != 0 || a.State != stock.TicketWaiting {
		t.Fatalf("before the open alice reads %+v", a)
	}
	for _, c := range []struct {
		s    *stock.SKU
		e    command.JoinEntry
		want stock.Outcome
	}{
		{s, command.JoinEntry{User: "", Secret: secretOf("x")}, stock.OutcomeInvalid},
		{s, command.JoinEntry{User: "carol", Secret: "ABCDEF0123456789ABCDEF0123456789"}, stock.OutcomeInvalid},
		{s, command.JoinEntry{User: "carol", Secret: secretOf("x")[:30]}, stock.OutcomeInvalid},
		{nil, command.JoinEntry{User: "carol", Secret: secretOf("carol")}, stock.OutcomeUnknownSKU},
		{&stock.SKU{SKU: "tv", Total: 1}, command.JoinEntry{User: "carol", Secret: secretOf("carol")}, stock.OutcomeNotQueued},
		{s, command.JoinEntry{User: "carol", Secret: a.Secret}, stock.OutcomeInvalid}, // a secret alice's ticket has
	} {
		if o, _, err := Join(tx, c.s, &c.e); err != nil || o != c.want {
			t.Errorf("join %+v: %v %v, want %v", c.e, o, err, c.want)
		}
	}
	if s.Queue.Joined != 2 {
		t.Fatalf("refused joins left joined at %d", s.Queue.Joined)
	}
}

// TestOpen_PositionsAreTheDrawnOrder: at the open the pre-open tickets
// take positions 1..N in the order of SHA-256(seed || hex(ticket id)),
// recomputed here from the seed and the tickets; later joins go to the
// back.
func TestOpen_PositionsAreTheDrawnOrder(t *testing.T) {
	tx, s := newTxn(), queuedSale("phone", 10)
	const n = 2000
	var tickets []stock.Ticket
	for i := range n {
		_, tk := join(t, tx, s, fmt.Sprintf("u%d", i))
		tickets = append(tickets, tk)
	}
	tx.at = start
	if _, err := Tick(tx, s, 0); err != nil {
		t.Fatal(err)
	}
	if !s.Queue.Opened() || s.Queue.PreOpen != n {
		t.Fatalf("after the open: %+v", s.Queue)
	}
	want := slices.Clone(tickets)
	slices.SortFunc(want, func(x, y stock.Ticket) int {
		kx, ky := OrderKey(s.Queue.Seed, x.ID), OrderKey(s.Queue.Seed, y.ID)
		return cmp.Or(bytes.Compare(kx[:], ky[:]), cmp.Compare(x.JoinedIndex, y.JoinedIndex))
	})
	for p := int64(1); p <= n; p++ {
		got, err := AtPosition(tx, s, p)
		if err != nil || got.ID != want[p-1].ID || got.Position != p {
			t.Fatalf("position %d holds %+v (%v), want ticket %d", p, got, err, want[p-1].JoinedIndex)
		}
	}
	moved := 0
	for p, tk := range want {
		if tk.JoinedIndex != int64(p)+1 {
			moved++
		}
	}
	if moved < n/2 { // arrival order must not decide the line
		t.Fatalf("only %d of %d tickets moved from their join order", moved, n)
	}
	tx.at++
	_, late := join(t, tx, s, "late")
	if late.Position != n+1 {
		t.Fatalf("a join after the open took position %d", late.Position)
	}
}

func openWith(t *testing.T, total int64, users int) (*memTxn, *stock.SKU) {
	t.Helper()
	tx, s := newTxn(), queuedSale("phone", total)
	for i := range users {
		join(t, tx, s, fmt.Sprintf("u%d", i))
	}
	tx.at = start
	if _, err := Tick(tx, s, 0); err != nil {
		t.Fatal(err)
	}
	return tx, s
}

func tick(t *testing.T, tx Txn, s *stock.SKU, through int64) int64 {
	t.Helper()
	n, err := Tick(tx, s, through)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// buy spends the ticket at position p as a winning take of one unit.
func buy(t *testing.T, tx Txn, s *stock.SKU, p int64) stock.Outcome {
	t.Helper()
	tk, err := AtPosition(tx, s, p)
	if err != nil {
		t.Fatal(err)
	}
	o, err := Spend(tx, s, tk.User, tk.ID)
	if err != nil {
		t.Fatal(err)
	}
	if o == stock.OutcomeOK {
		s.Available--
		s.Sold++
		Settle(s, tx.At())
	}
	return o
}

// TestTick_AdmitsUnderTheBound: tokens out never pass
// ceil(overadmit × remaining); buying lowers remaining and the bound with
// it; an admission that runs out frees its place for the next position.
func TestTick_AdmitsUnderTheBound(t *testing.T) {
	tx, s := openWith(t, 10, 100)
	if got := tick(t, tx, s, 100); got != 12 || s.Queue.Outstanding != 12 || s.Queue.AdmittedThrough != 12 {
		t.Fatalf("admitted %d, queue %+v; want 12 = ceil(1.2 × 10)", got, s.Queue)
	}
	for p := int64(1); p <= 5; p++ {
		if o := buy(t, tx, s, p); o != stock.OutcomeOK {
			t.Fatalf("position %d: %v", p, o)
		}
	}
	// remaining 5: the bound is 6, and 7 tokens are out.
	if got := tick(t, tx, s, 100); got != 0 || s.Queue.Outstanding != 7 {
		t.Fatalf("admitted %d more with 7 out and a bound of 6: %+v", got, s.Queue)
	}
	tx.at += int64(time.Minute) // every unused token runs out
	if got := tick(t, tx, s, 100); got != 6 || s.Queue.Expired != 7 || s.Queue.Outstanding != 6 || s.Queue.AdmittedThrough != 18 {
		t.Fatalf("after the expiry: admitted %d, %+v", got, s.Queue)
	}
	if tk, _ := AtPosition(tx, s, 6); tk.State != stock.TicketExpired {
		t.Fatalf("position 6 reads %s", tk.State)
	}
	if o := buy(t, tx, s, 6); o != stock.OutcomeAdmissionInvalid {
		t.Fatalf("an expired ticket bought: %v", o)
	}
}

// TestSpend_OncePerTicket: a token buys once, for its user and sale.
func TestSpend_OncePerTicket(t *testing.T) {
	tx, s := openWith(t, 10, 5)
	tick(t, tx, s, 3)
	first, _ := AtPosition(tx, s, 1)
	waiting, _ := AtPosition(tx, s, 4)
	other := queuedSale("tv", 10)
	for _, c := range []struct {
		name string
		s    *stock.SKU
		user string
		id   [32]byte
		want stock.Outcome
	}{
		{"another user's", s, "mallory", first.ID, stock.OutcomeAdmissionInvalid},
		{"another sale's", other, first.User, first.ID, stock.OutcomeAdmissionInvalid},
		{"not admitted yet", s, waiting.User, waiting.ID, stock.OutcomeAdmissionInvalid},
		{"unknown", s, first.User, queuetoken.TicketID("nobody"), stock.OutcomeAdmissionInvalid},
		{"its own", s, first.User, first.ID, stock.OutcomeOK},
		{"spent", s, first.User, first.ID, stock.OutcomeAdmissionInvalid},
	} {
		if o, err := Spend(tx, c.s, c.user, c.id); err != nil || o != c.want {
			t.Errorf("%s: %v %v, want %v", c.name, o, err, c.want)
		}
	}
	if s.Queue.Bought != 1 || s.Queue.Outstanding != 2 {
		t.Fatalf("queue %+v", s.Queue)
	}
}

// TestSettle_SoldOutToldToEveryone: once remaining and held are both 0,
// every ticket not bought reads sold_out and joins are refused; held
// units keep the line waiting; a restock lets it go on.
func TestSettle_SoldOutToldToEveryone(t *testing.T) {
	tx, s := openWith(t, 2, 10)
	tick(t, tx, s, 10)
	buy(t, tx, s, 1)
	s.Available--
	s.Held++ // position 2's buyer holds the last unit
	Settle(s, tx.at)
	if w, _ := AtPosition(tx, s, 5); w.State != stock.TicketWaiting || s.Queue.SoldOutAtUnixNano != 0 {
		t.Fatalf("with a unit held, position 5 reads %s", w.State)
	}
	s.Held--
	s.Sold++
	Settle(s, tx.at)
	for p := int64(2); p <= 10; p++ {
		if w, _ := AtPosition(tx, s, p); w.State != stock.TicketSoldOut {
			t.Fatalf("position %d reads %s after the last unit sold", p, w.State)
		}
	}
	if b, _ := AtPosition(tx, s, 1); b.State != stock.TicketBought {
		t.Fatalf("the buyer's ticket reads %s", b.State)
	}
	// An answer once given stays: the admissions that would have run out
	// since do not turn sold_out into expired.
	tx.at += int64(time.Minute)
	tick(t, tx, s, 10)
	for p := int64(2); p <= 3; p++ {
		if w, _ := AtPosition(tx, s, p); w.State != stock.TicketSoldOut || s.Queue.Expired != 0 {
			t.Fatalf("position %d, admitted before the sell-out, reads %s after its expiry (%d expired)", p, w.State, s.Queue.Expired)
		}
	}
	if o, _ := join(t, tx, s, "late"); o != stock.OutcomeSoldOut {
		t.Fatalf("a join after the sell-out: %v", o)
	}
	s.Total++
	s.Available++
	Settle(s, tx.at)
	if w, _ := AtPosition(tx, s, 5); w.State != stock.TicketWaiting {
		t.Fatalf("after a restock position 5 reads %s", w.State)
	}
	s.ClosedAtUnixNano = tx.at
	if w, _ := AtPosition(tx, s, 5); w.State != stock.TicketSoldOut {
		t.Fatalf("after the sale closed position 5 reads %s", w.State)
	}
}

// TestToken_AdmittedTicketsTokenVerifiesUntilItsKeyRotatesOut: every node
// computes the same token from the admission; it verifies under the
// sale's keys through one rotation, not two.
func TestToken_AdmittedTicketsTokenVerifiesUntilItsKeyRotatesOut(t *testing.T) {
	tx, s := openWith(t, 5, 3)
	tick(t, tx, s, 1)
	tk, _ := AtPosition(tx, s, 1)
	tokStr := Token(s, &tk)
	if w, _ := AtPosition(tx, s, 2); Token(s, &w) != "" {
		t.Fatal("a waiting ticket has a token")
	}
	tok, err := queuetoken.Parse(tokStr)
	if err != nil {
		t.Fatal(err)
	}
	check := func() error { return tok.Verify(Keys(s), s.SKU, tk.User, tx.at) }
	if err := check(); err != nil || tok.TicketID != tk.ID {
		t.Fatalf("fresh token: %v", err)
	}
	if Rotate(s, bytes.Repeat([]byte{1}, queuetoken.KeySize), tx.at) != stock.OutcomeOK || check() != nil {
		t.Fatalf("after one rotation: %v", check())
	}
	if Rotate(s, bytes.Repeat([]byte{2}, queuetoken.KeySize), tx.at); !errors.Is(check(), queuetoken.ErrUnknownKey) {
		t.Fatalf("after two rotations: %v", check())
	}
	if Rotate(s, []byte("short"), tx.at) != stock.OutcomeInvalid {
		t.Fatal("a short key was taken")
	}
}
