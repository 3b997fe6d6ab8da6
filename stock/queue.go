package stock

// The waiting room: a sale created with Admission AdmissionQueue sells
// only to buyers it admitted. Tickets join before the open or after it;
// at the open the tickets joined before it are put in an order drawn from
// a committed seed, later joins go to the back; the leader admits
// positions in order while the tokens out stay under the bound; a token
// buys once; when nothing can still be won every waiting ticket is told.

// AdmissionQueue is SaleConfig.Admission of a sale behind a waiting room.
const AdmissionQueue = "queue"

// Defaults of a queued sale's settings.
const (
	DefaultQueueOveradmitMilli = 1200
	DefaultQueueAdmitTTLNanos  = int64(5 * 60 * 1e9)
)

// QueueOveradmit is the sale's queue_overadmit in thousandths, the
// default when unset.
func (c *SaleConfig) QueueOveradmit() int64 {
	if c.QueueOveradmitMilli == 0 {
		return DefaultQueueOveradmitMilli
	}
	return c.QueueOveradmitMilli
}

// QueueAdmitTTL is how long the sale's admissions last (nanoseconds), the
// default when unset.
func (c *SaleConfig) QueueAdmitTTL() int64 {
	if c.QueueAdmitTTLNanos == 0 {
		return DefaultQueueAdmitTTLNanos
	}
	return c.QueueAdmitTTLNanos
}

// Ticket states, as GET /v1/queue/{ticket} answers them.
const (
	TicketWaiting  = "waiting"  // before the open, or in line after it
	TicketAdmitted = "admitted" // a token is out, valid until its expiry
	TicketBought   = "bought"   // a deduct with its token won
	TicketExpired  = "expired"  // admitted, its token expired unused: the place is gone
	TicketSoldOut  = "sold_out" // no unit can still reach this place
)

// Queue is a queued sale's part of its row.
type Queue struct {
	SeedCommitment []byte `json:"seed_commitment"`
	Seed           []byte `json:"seed"` // revealed at the open (kept from the creation)
	// Keys sign the sale's tokens: the current last, the previous before
	// it (never shown).
	Keys []QueueKey `json:"keys"`
	// Joined counts tickets: a ticket's join index is its place in it,
	// from 1. PreOpen is how many joined before the open (positions
	// 1..PreOpen are theirs in the drawn order); a ticket that joined after
	// it has its join index as its position.
	Joined           int64 `json:"joined"`
	OpenedAtUnixNano int64 `json:"opened_at,omitempty"`
	PreOpen          int64 `json:"pre_open,omitempty"`
	// AdmittedThrough is the last position admitted: positions are
	// admitted in order. ExpiredThrough is the last position whose
	// admission's expiry has been processed (expiries follow positions).
	AdmittedThrough int64 `json:"admitted_through,omitempty"`
	ExpiredThrough  int64 `json:"expired_through,omitempty"`
	// Outstanding counts tokens issued, not used by a winning deduct, not
	// expired; AdmittedTotal every token issued; Bought the tickets whose
	// token won; Expired the admissions that ran out unused.
	Outstanding   int64 `json:"admitted_outstanding"`
	AdmittedTotal int64 `json:"admitted_total"`
	Bought        int64 `json:"bought"`
	Expired       int64 `json:"expired"`
	// SoldOutAtUnixNano: remaining and held were both 0 then, and every
	// ticket not bought reads sold_out (0: not now; a restock clears it).
	SoldOutAtUnixNano int64 `json:"sold_out_at,omitempty"`
}

// QueueKey is one signing key of a sale's tokens.
type QueueKey struct {
	ID            uint32 `json:"id"`
	Bytes         []byte `json:"bytes"`
	AddedUnixNano int64  `json:"added_at"`
}

// Opened reports whether the sale's queue was put in order.
func (q *Queue) Opened() bool { return q.OpenedAtUnixNano != 0 }

// Ticket is one buyer's place in a sale's waiting room.
type Ticket struct {
	SKU    string
	User   string
	Secret string // the joiner's: it reads the ticket and its token
	ID     [32]byte
	// JoinedIndex is the ticket's place in join order, from 1; Position
	// its place in line (0 before the open).
	JoinedIndex      int64
	Position         int64
	JoinedAtUnixNano int64
	// State is one of the Ticket* states as of the ledger's last entry;
	// AdmittedUntilUnixNano the token's expiry once admitted; KeyID the
	// signing key of its token.
	State                 string
	AdmittedUntilUnixNano int64
	KeyID                 uint32
}
