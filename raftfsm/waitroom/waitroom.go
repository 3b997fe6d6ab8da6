// Package waitroom is what every node applies alike for a sale behind a
// waiting room (stock.AdmissionQueue): joins, the open, admissions in
// position order under the bound, expiries, the single use of a token,
// and "sold out" for everyone at once.
//
// The order at the open is a documented function of the seed, committed
// when the sale is created and revealed at the open, and of the tickets'
// public ids:
//
//	key(ticket) = SHA-256(seed || hex(ticket_id))   (64 lower-case hex characters)
//
// The tickets joined before the open sort by key, ascending (join order
// on a tie), and take positions 1..N; a ticket that joins after the open
// takes the next position, which is its join index. Anyone holding the
// seed and the tickets stream recomputes every position.
//
// Tickets live in four buckets of the ledger file: the record by sale and
// join index, the sale's index by user (the user's current ticket), the
// index by ticket id, and the drawn order by position (the pre-open
// tickets only). A ticket costs about 150 bytes of file and nothing in
// memory.
package waitroom

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"

	"stockd.dev/stockd/internal/queuetoken"
	"stockd.dev/stockd/internal/wire"
	"stockd.dev/stockd/stock"
)

// Buckets of the ledger file the waiting room writes.
var (
	BucketTickets     = []byte("queue_tickets")      // sku 0 be64(join index) -> ticket record
	BucketTicketUsers = []byte("queue_ticket_users") // sku 0 user -> be64(join index)
	BucketTicketIDs   = []byte("queue_ticket_ids")   // ticket id (32 bytes) -> sku 0 be64(join index)
	BucketPositions   = []byte("queue_positions")    // sku 0 be64(position) -> be64(join index)
	Buckets           = [][]byte{BucketTickets, BucketTicketUsers, BucketTicketIDs, BucketPositions}
)

const (
	// SecretBytes is CreateSale.Secret of a queued sale: the 32-byte seed
	// of the order, then the first signing key of its tokens.
	SecretBytes = seedBytes + queuetoken.KeySize
	seedBytes   = 32
	// MaxTickets bounds one sale's waiting room: the open reads and sorts
	// every pre-open ticket in one Apply.
	MaxTickets = 10_000_000
)

// ErrMalformed is a record the waiting room cannot read.
var ErrMalformed = errors.New("malformed waiting-room record")

// Reader reads the ledger file's records (nil: none).
type Reader interface {
	Get(bucket, key []byte) ([]byte, error)
}

// Txn is the part of the applier's batch the waiting room uses: reads
// that see the batch's own writes, writes, and the entry's time.
type Txn interface {
	Reader
	Put(bucket, key, value []byte)
	At() int64
}

// New is the queue part of a new sale's row, from the secret its
// CreateSale carries.
func New(secret []byte, at int64) *stock.Queue {
	seed := slices.Clone(secret[:seedBytes])
	sum := sha256.Sum256(seed)
	return &stock.Queue{SeedCommitment: sum[:], Seed: seed,
		Keys: []stock.QueueKey{{ID: 1, Bytes: slices.Clone(secret[seedBytes:]), AddedUnixNano: at}}}
}

// OrderKey is a pre-open ticket's sort key at the open.
func OrderKey(seed []byte, id [queuetoken.IDSize]byte) [sha256.Size]byte {
	var buf [seedBytes + 2*queuetoken.IDSize]byte
	b := append(buf[:0], seed...)
	b = hex.AppendEncode(b, id[:])
	return sha256.Sum256(b)
}

func saleKey(dst []byte, sku string) []byte { return append(append(dst, sku...), 0) }

func indexKey(sku string, n int64) []byte {
	return binary.BigEndian.AppendUint64(saleKey(nil, sku), uint64(n))
}

// ticket states as the record stores them; sold_out is read from the
// sale's row.
const (
	stateWaiting byte = iota + 1
	stateAdmitted
	stateBought
	stateExpired
)

var stateNames = [...]string{stateWaiting: stock.TicketWaiting, stateAdmitted: stock.TicketAdmitted,
	stateBought: stock.TicketBought, stateExpired: stock.TicketExpired}

const recordVersion = 1

func encodeTicket(t *stock.Ticket, state byte) []byte {
	b := []byte{recordVersion, state}
	b = wire.AppendString(b, t.User)
	b = wire.AppendString(b, t.Secret)
	b = append(b, t.ID[:]...)
	b = wire.AppendVarint(b, t.JoinedAtUnixNano)
	b = wire.AppendVarint(b, t.Position)
	b = wire.AppendVarint(b, t.AdmittedUntilUnixNano)
	return wire.AppendUvarint(b, uint64(t.KeyID))
}

func decodeTicket(sku string, joined int64, b []byte) (stock.Ticket, byte, error) {
	d := wire.Decoder{B: b}
	if d.Byte() != recordVersion {
		return stock.Ticket{}, 0, fmt.Errorf("%w: ticket %d of %q", ErrMalformed, joined, sku)
	}
	state := d.Byte()
	t := stock.Ticket{SKU: sku, JoinedIndex: joined, User: d.String(), Secret: d.String()}
	if len(d.B) < len(t.ID) {
		return stock.Ticket{}, 0, fmt.Errorf("%w: ticket %d of %q", ErrMalformed, joined, sku)
	}
	copy(t.ID[:], d.B)
	d.B = d.B[len(t.ID):]
	t.JoinedAtUnixNano, t.Position, t.AdmittedUntilUnixNano = d.Varint(), d.Varint(), d.Varint()
	t.KeyID = uint32(d.Uvarint())
	if err := d.Finish(); err != nil || state < stateWaiting || state > stateExpired {
		return stock.Ticket{}, 0, fmt.Errorf("%w: ticket %d of %q: %v", ErrMalformed, joined, sku, err)
	}
	t.State = stateNames[state]
	return t, state, nil
}

func getIndex(tx Reader, bucket, key []byte) (int64, bool, error) {
	v, err := tx.Get(bucket, key)
	if err != nil || v == nil {
		return 0, false, err
	}
	if len(v) != 8 {
		return 0, false, fmt.Errorf("%w: index of %d bytes", ErrMalformed, len(v))
	}
	return int64(binary.BigEndian.Uint64(v)), true, nil
}

// ticketAt reads sale sku's ticket of join index n.
func ticketAt(tx Reader, sku string, n int64) (stock.Ticket, byte, error) {
	v, err := tx.Get(BucketTickets, indexKey(sku, n))
	if err != nil {
		return stock.Ticket{}, 0, err
	}
	if v == nil {
		panic(fmt.Sprintf("BUG: ticket %d of %q is missing", n, sku))
	}
	return decodeTicket(sku, n, v)
}

func putTicket(tx Txn, t *stock.Ticket, state byte) {
	tx.Put(BucketTickets, indexKey(t.SKU, t.JoinedIndex), encodeTicket(t, state))
}

// joinedAt is the join index of the ticket at position p of sale s.
func joinedAt(tx Reader, s *stock.SKU, p int64) (int64, error) {
	if p > s.Queue.PreOpen {
		return p, nil
	}
	n, ok, err := getIndex(tx, BucketPositions, indexKey(s.SKU, p))
	if err == nil && !ok {
		panic(fmt.Sprintf("BUG: position %d of %q has no ticket", p, s.SKU))
	}
	return n, err
}

// Find names the ticket whose secret is secret: its sale and join index
// (ok false: no such ticket).
func Find(r Reader, secret string) (sku string, joined int64, ok bool, err error) {
	id := queuetoken.TicketID(secret)
	v, err := r.Get(BucketTicketIDs, id[:])
	if err != nil || v == nil {
		return "", 0, false, err
	}
	if len(v) < 9 || v[len(v)-9] != 0 {
		return "", 0, false, fmt.Errorf("%w: ticket id index of %d bytes", ErrMalformed, len(v))
	}
	return string(v[:len(v)-9]), int64(binary.BigEndian.Uint64(v[len(v)-8:])), true, nil
}

// Read is ticket n of sale s, as the sale's row says it stands.
func Read(r Reader, s *stock.SKU, n int64) (stock.Ticket, error) {
	t, state, err := ticketAt(r, s.SKU, n)
	if err != nil {
		return stock.Ticket{}, err
	}
	return Shown(s, t, state), nil
}

// OfUser is user's current ticket for sale s (ok false: none).
func OfUser(r Reader, s *stock.SKU, user string) (stock.Ticket, bool, error) {
	n, ok, err := getIndex(r, BucketTicketUsers, append(saleKey(nil, s.SKU), user...))
	if err != nil || !ok {
		return stock.Ticket{}, false, err
	}
	t, err := Read(r, s, n)
	return t, err == nil, err
}

// AtPosition is the ticket at position p of sale s, once it opened.
func AtPosition(r Reader, s *stock.SKU, p int64) (stock.Ticket, error) {
	t, state, err := positionOf(r, s, p)
	if err != nil {
		return stock.Ticket{}, err
	}
	return Shown(s, t, state), nil
}

// positionOf reads the ticket at position p of sale s as stored.
func positionOf(r Reader, s *stock.SKU, p int64) (stock.Ticket, byte, error) {
	n, err := joinedAt(r, s, p)
	if err != nil {
		return stock.Ticket{}, 0, err
	}
	return ticketAt(r, s.SKU, n)
}

// Each calls fn for every ticket of sale s (its row as read) in line
// order once it opened, in join order before, until fn returns an error.
func Each(r Reader, s *stock.SKU, fn func(*stock.Ticket) error) error {
	for i := int64(1); i <= s.Queue.Joined; i++ {
		var t stock.Ticket
		var err error
		if s.Queue.Opened() {
			t, err = AtPosition(r, s, i)
		} else {
			t, err = Read(r, s, i)
		}
		if err == nil {
			err = fn(&t)
		}
		if err != nil {
			return err
		}
	}
	return nil
}
