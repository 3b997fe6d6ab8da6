package waitroom

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"slices"

	"stockd.dev/stockd/internal/queuetoken"
	"stockd.dev/stockd/raftfsm/command"
	"stockd.dev/stockd/stock"
)

// maxKeyBytes bounds a user name, as the ledger bounds its other keys.
const maxKeyBytes = 256

// Join applies one join of sale s (nil: no such sale): the user's ticket,
// new or the one they hold (OutcomeSame). A user whose admission expired
// unused joins again at the back.
func Join(tx Txn, s *stock.SKU, e *command.JoinEntry) (stock.Outcome, stock.Ticket, error) {
	if e.User == "" || len(e.User) > maxKeyBytes || len(e.Secret) != 2*command.JoinSecretBytes || !isLowerHex(e.Secret) {
		return stock.OutcomeInvalid, stock.Ticket{}, nil
	}
	switch {
	case s == nil:
		return stock.OutcomeUnknownSKU, stock.Ticket{}, nil
	case s.Queue == nil:
		return stock.OutcomeNotQueued, stock.Ticket{}, nil
	}
	if err := openIfDue(tx, s); err != nil {
		return 0, stock.Ticket{}, err
	}
	q := s.Queue
	userKey := append(saleKey(nil, s.SKU), e.User...)
	if n, ok, err := getIndex(tx, BucketTicketUsers, userKey); err != nil || ok {
		if err != nil {
			return 0, stock.Ticket{}, err
		}
		t, state, err := ticketAt(tx, s.SKU, n)
		if err != nil || state != stateExpired {
			return stock.OutcomeSame, Shown(s, t, state), err
		}
	}
	switch {
	case s.Closed():
		return stock.OutcomeClosed, stock.Ticket{}, nil
	case q.SoldOutAtUnixNano != 0:
		return stock.OutcomeSoldOut, stock.Ticket{}, nil
	case q.Joined >= MaxTickets:
		return stock.OutcomeInvalidState, stock.Ticket{}, nil
	}
	q.Joined++
	t := stock.Ticket{SKU: s.SKU, User: e.User, Secret: e.Secret, ID: queuetoken.TicketID(e.Secret),
		JoinedIndex: q.Joined, JoinedAtUnixNano: tx.At(), State: stock.TicketWaiting}
	if q.Opened() {
		t.Position = t.JoinedIndex
	}
	if prior, err := tx.Get(BucketTicketIDs, t.ID[:]); err != nil || prior != nil {
		if err != nil {
			return 0, stock.Ticket{}, err
		}
		q.Joined--
		return stock.OutcomeInvalid, stock.Ticket{}, nil // a secret some ticket has: the joining node's randomness failed
	}
	putTicket(tx, &t, stateWaiting)
	idx := binary.BigEndian.AppendUint64(nil, uint64(t.JoinedIndex))
	tx.Put(BucketTicketUsers, userKey, idx)
	tx.Put(BucketTicketIDs, t.ID[:], indexKey(s.SKU, t.JoinedIndex))
	return stock.OutcomeOK, Shown(s, t, stateWaiting), nil
}

func isLowerHex(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// Shown is ticket t, stored in state, as the sale's row says it stands:
// a ticket not bought reads sold_out once nothing can still be won (every
// unit sold, or the sale closed).
func Shown(s *stock.SKU, t stock.Ticket, state byte) stock.Ticket {
	if (s.Queue.SoldOutAtUnixNano != 0 || s.Closed()) && (state == stateWaiting || state == stateAdmitted) {
		t.State = stock.TicketSoldOut
	}
	return t
}

// openIfDue puts the pre-open tickets of s in the drawn order once the
// entry's time has reached start_at.
func openIfDue(tx Txn, s *stock.SKU) error {
	q := s.Queue
	if q.Opened() || tx.At() < s.Config.StartAtUnixNano {
		return nil
	}
	type ranked struct {
		key    [32]byte
		joined int64
	}
	order := make([]ranked, q.Joined)
	for n := int64(1); n <= q.Joined; n++ {
		t, _, err := ticketAt(tx, s.SKU, n)
		if err != nil {
			return err
		}
		order[n-1] = ranked{OrderKey(q.Seed, t.ID), n}
	}
	slices.SortFunc(order, func(x, y ranked) int {
		if c := bytes.Compare(x.key[:], y.key[:]); c != 0 {
			return c
		}
		return cmp.Compare(x.joined, y.joined)
	})
	for i, r := range order {
		p := int64(i) + 1
		t, state, err := ticketAt(tx, s.SKU, r.joined)
		if err != nil {
			return err
		}
		t.Position = p
		putTicket(tx, &t, state)
		tx.Put(BucketPositions, indexKey(s.SKU, p), binary.BigEndian.AppendUint64(nil, uint64(r.joined)))
	}
	q.OpenedAtUnixNano, q.PreOpen = tx.At(), q.Joined
	return nil
}

// Bound is how many tokens may be out at once for s:
// ceil(queue_overadmit × remaining).
func Bound(s *stock.SKU) int64 {
	return (s.Config.QueueOveradmit()*max(s.Remaining(), 0) + 999) / 1000
}

// Tick applies a QueueTick to s: the open once due, the expiry of every
// admission whose token ran out, then admissions in position order up to
// through while the tokens out stay under the bound. It returns how many
// it admitted.
func Tick(tx Txn, s *stock.SKU, through int64) (int64, error) {
	if err := openIfDue(tx, s); err != nil {
		return 0, err
	}
	q := s.Queue
	if !q.Opened() || s.Closed() || q.SoldOutAtUnixNano != 0 {
		// Sold out or closed, every ticket not bought was told sold_out:
		// an admission running out since must not turn that into expired
		// (a restock lets the expiries go on).
		return 0, nil
	}
	for q.ExpiredThrough < q.AdmittedThrough {
		p := q.ExpiredThrough + 1
		t, state, err := positionOf(tx, s, p)
		if err != nil {
			return 0, err
		}
		if state == stateAdmitted {
			if t.AdmittedUntilUnixNano > tx.At() {
				break // later positions were admitted no earlier
			}
			putTicket(tx, &t, stateExpired)
			q.Outstanding--
			q.Expired++
		}
		q.ExpiredThrough = p
	}
	want := min(through, q.Joined) - q.AdmittedThrough
	room := Bound(s) - q.Outstanding
	ttl := s.Config.QueueAdmitTTL()
	key := q.Keys[len(q.Keys)-1].ID
	var admitted int64
	for ; admitted < min(want, room); admitted++ {
		p := q.AdmittedThrough + 1
		t, state, err := positionOf(tx, s, p)
		if err != nil {
			return 0, err
		}
		if state != stateWaiting {
			panic(fmt.Sprintf("BUG: position %d of %q is %s before its admission", p, s.SKU, t.State))
		}
		t.AdmittedUntilUnixNano, t.KeyID = tx.At()+ttl, key
		putTicket(tx, &t, stateAdmitted)
		q.AdmittedThrough = p
		q.Outstanding++
		q.AdmittedTotal++
	}
	return admitted, nil
}

// Spend marks the ticket id of a take from s bought: the take's user's,
// admitted, its token not expired at the entry's time. Any other ticket
// refuses the take (OutcomeAdmissionInvalid).
func Spend(tx Txn, s *stock.SKU, user string, id [queuetoken.IDSize]byte) (stock.Outcome, error) {
	v, err := tx.Get(BucketTicketIDs, id[:])
	prefix := saleKey(nil, s.SKU)
	if err != nil || len(v) != len(prefix)+8 || !bytes.HasPrefix(v, prefix) {
		return stock.OutcomeAdmissionInvalid, err // no such ticket, or another sale's
	}
	t, state, err := ticketAt(tx, s.SKU, int64(binary.BigEndian.Uint64(v[len(v)-8:])))
	if err != nil {
		return 0, err
	}
	if t.User != user || state != stateAdmitted || tx.At() >= t.AdmittedUntilUnixNano {
		return stock.OutcomeAdmissionInvalid, nil
	}
	putTicket(tx, &t, stateBought)
	s.Queue.Outstanding--
	s.Queue.Bought++
	return stock.OutcomeOK, nil
}

// Settle records, on a queued sale's row after an entry changed it, when
// nothing could still be won (remaining and held both 0: every ticket not
// bought reads sold_out), and forgets it once units are back (a restock).
func Settle(s *stock.SKU, at int64) {
	q := s.Queue
	switch {
	case q == nil:
	case s.Remaining() == 0 && s.Held == 0:
		if q.SoldOutAtUnixNano == 0 {
			q.SoldOutAtUnixNano = at
		}
	case s.Remaining() > 0:
		q.SoldOutAtUnixNano = 0
	}
}

// Rotate makes key the current signing key of s's tokens; the previous
// one still verifies, the one before it no longer does.
func Rotate(s *stock.SKU, key []byte, at int64) stock.Outcome {
	if s.Queue == nil {
		return stock.OutcomeNotQueued
	}
	if len(key) != queuetoken.KeySize {
		return stock.OutcomeInvalid
	}
	keys := s.Queue.Keys
	cur := keys[len(keys)-1]
	s.Queue.Keys = []stock.QueueKey{cur, {ID: cur.ID + 1, Bytes: slices.Clone(key), AddedUnixNano: at}}
	return stock.OutcomeOK
}

// Keys are the keys that verify s's tokens now.
func Keys(s *stock.SKU) []queuetoken.Key {
	out := make([]queuetoken.Key, len(s.Queue.Keys))
	for i, k := range s.Queue.Keys {
		out[i] = queuetoken.Key{ID: k.ID, Bytes: k.Bytes}
	}
	return out
}

// Token is the admission token of ticket t of sale s, computed from its
// admission alike on every node ("" unless it is admitted now and its key
// still verifies).
func Token(s *stock.SKU, t *stock.Ticket) string {
	if t.State != stock.TicketAdmitted {
		return ""
	}
	for _, k := range s.Queue.Keys {
		if k.ID == t.KeyID {
			return queuetoken.Sign(queuetoken.Key{ID: k.ID, Bytes: k.Bytes}, s.SKU, t.User, t.ID, t.AdmittedUntilUnixNano).String()
		}
	}
	return ""
}

// TicketIDHex is a ticket's public name on the wire.
func TicketIDHex(t *stock.Ticket) string { return hex.EncodeToString(t.ID[:]) }

// Apply applies a waiting-room command (Join, QueueTick, RotateQueueKey);
// sku reads a sale's row for changing (nil: no such sale).
func Apply(tx Txn, c command.Command, sku func(string) *stock.SKU) (*command.Result, error) {
	switch c := c.(type) {
	case *command.Join:
		res := &command.Result{Outcome: stock.OutcomeOK, Tickets: make([]command.TicketResult, len(c.Entries))}
		for i := range c.Entries {
			o, t, err := Join(tx, sku(c.Entries[i].SKU), &c.Entries[i])
			if err != nil {
				return nil, err
			}
			res.Tickets[i] = command.TicketResult{Outcome: o, Joined: t.JoinedIndex}
		}
		return res, nil
	case *command.QueueTick:
		s := sku(c.SKU)
		if o := queued(s); o != stock.OutcomeOK {
			return &command.Result{Outcome: o}, nil
		}
		n, err := Tick(tx, s, c.Through)
		return &command.Result{Outcome: stock.OutcomeOK, Qty: n}, err
	case *command.RotateQueueKey:
		s := sku(c.SKU)
		if o := queued(s); o != stock.OutcomeOK {
			return &command.Result{Outcome: o}, nil
		}
		return &command.Result{Outcome: Rotate(s, c.Key, tx.At())}, nil
	}
	return &command.Result{Outcome: stock.OutcomeInvalid, Detail: fmt.Sprintf("%T is no waiting-room command", c)}, nil
}

func queued(s *stock.SKU) stock.Outcome {
	switch {
	case s == nil:
		return stock.OutcomeUnknownSKU
	case s.Queue == nil:
		return stock.OutcomeNotQueued
	}
	return stock.OutcomeOK
}

// SpendTake judges the ticket of a take from queued sale s: none
// (OutcomeAdmissionRequired), or one Spend takes or refuses.
func SpendTake(tx Txn, s *stock.SKU, e *command.TakeEntry) (stock.Outcome, error) {
	if e.Ticket == "" {
		return stock.OutcomeAdmissionRequired, nil
	}
	if len(e.Ticket) != queuetoken.IDSize {
		return stock.OutcomeAdmissionInvalid, nil
	}
	return Spend(tx, s, e.User, [queuetoken.IDSize]byte([]byte(e.Ticket)))
}

// CheckConfig says what is wrong with a new sale's waiting-room settings
// and its CreateSale's secret ("" when nothing is).
func CheckConfig(cfg *stock.SaleConfig, secret []byte) string {
	switch cfg.Admission {
	case "":
		if cfg.QueueOveradmitMilli != 0 || cfg.QueueAdmitTTLNanos != 0 {
			return "queue_overadmit and queue_admit_ttl are for sales with admission queue"
		}
		return ""
	case stock.AdmissionQueue:
	default:
		return fmt.Sprintf("unknown admission %q", cfg.Admission)
	}
	switch {
	case cfg.Mode != "":
		return "a lottery takes no waiting room"
	case cfg.QueueOveradmitMilli != 0 && (cfg.QueueOveradmitMilli < 1000 || cfg.QueueOveradmitMilli > 100_000):
		return "queue_overadmit must be from 1 to 100"
	case cfg.QueueAdmitTTLNanos != 0 && cfg.QueueAdmitTTLNanos < 1e9:
		return "queue_admit_ttl must be at least 1s"
	case len(secret) != SecretBytes:
		return fmt.Sprintf("a queued sale needs a %d-byte secret, got %d", SecretBytes, len(secret))
	}
	return ""
}
