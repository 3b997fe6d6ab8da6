package command

import (
	"fmt"
	"stockd.dev/stockd/internal/wire"
	"stockd.dev/stockd/stock"
)

// Op names a ledger command.
type Op uint8

// The ledger commands. Values are part of the log format: append,
// never renumber.
const (
	OpCreateSale Op = iota + 1
	OpRestock
	OpLease
	OpReturn
	OpTake
	OpConfirm
	OpRelease
	OpReclaim
	OpRegister
	OpExpire
	OpPruneRequests
	OpAckConsumer
	OpPruneEvents
	OpCloseSale
	OpArchiveSale
	OpPurgeArchived
	OpEnter
	OpDraw
	OpSetRules
	OpPurgeOrders
	OpJoin
	OpQueueTick
	OpRotateQueueKey
	// OpTakeQueued is a Take whose entries carry waiting-room tickets:
	// each entry's ticket follows its order id.
	OpTakeQueued
)

var opNames = [...]string{
	OpCreateSale: "create_sale", OpRestock: "restock", OpLease: "lease", OpReturn: "return",
	OpTake: "take", OpConfirm: "confirm", OpRelease: "release", OpReclaim: "reclaim",
	OpRegister: "register", OpExpire: "expire", OpPruneRequests: "prune_requests",
	OpAckConsumer: "ack_consumer", OpPruneEvents: "prune_events",
	OpCloseSale: "close_sale", OpArchiveSale: "archive_sale", OpPurgeArchived: "purge_archived",
	OpEnter: "enter", OpDraw: "draw", OpSetRules: "set_rules", OpPurgeOrders: "purge_orders",
	OpJoin: "join", OpQueueTick: "queue_tick", OpRotateQueueKey: "rotate_queue_key", OpTakeQueued: "take_queued",
}

func (o Op) String() string {
	if int(o) < len(opNames) && opNames[o] != "" {
		return opNames[o]
	}
	return fmt.Sprintf("op(%d)", uint8(o))
}

// Command is one entry of the replicated log: exactly one of the types
// below, each carrying only what its op needs. Commands travel as
// EncodeCommand bytes, in the raft log and between nodes alike; the
// proposer's clock travels beside them (Apply never reads a clock).
type Command interface {
	Op() Op
	appendFields(b []byte) []byte
	decodeFields(d *wire.Decoder)
}

// CreateSale puts a new sale of Sale.Total units on the ledger. A
// lottery's Secret (LotterySecretBytes, drawn by the proposing node) holds
// its seed and its order-id key, a queued sale's its seed and its first
// signing key; it is not part of the config, so the same sale created
// again with a new secret is still the same sale.
type CreateSale struct {
	SKU    string
	Sale   stock.SaleConfig
	Secret []byte
}

// Restock adds Qty units to a sale.
type Restock struct {
	SKU string
	Qty int64
}

// Lease asks for up to Want units of a sale for Node's buckets. When the
// ledger has none available while other nodes hold leases, the request is
// recorded as demand (EventLeaseWanted) and the holders give some back.
type Lease struct {
	Node string
	SKU  string
	Want int64
}

// Return gives Qty units of Node's lease back to available.
type Return struct {
	Node string
	SKU  string
	Qty  int64
}

// Take is a batch of won deducts from Node's buckets; each entry is
// accepted or refused on its own.
type Take struct {
	Node    string
	Entries []TakeEntry
	queued  bool // decoding an OpTakeQueued
}

// Confirm turns a held order sold.
type Confirm struct{ OrderID string }

// Release returns a held order's units (Reason: cancelled or expired).
type Release struct {
	OrderID string
	Reason  string
}

// Reclaim returns all of Node's leases to available.
type Reclaim struct{ Node string }

// Register records Node's HTTP address, for forwarding.
type Register struct {
	Node string
	Addr string
}

// Expire releases the listed held orders whose deadline has passed at the
// command's time.
type Expire struct{ OrderIDs []string }

// PruneRequests forgets request ids whose order was created before
// BeforeUnixNano, then the oldest beyond MaxKeep (0: no count limit).
type PruneRequests struct {
	BeforeUnixNano int64
	MaxKeep        int64
}

// AckConsumer sets the cursor consumer Name of the order feed has
// acknowledged (registering the consumer), or with Drop removes it. With
// Forward (a service's acknowledgement, ledger rules 5) it only moves a
// registered consumer forward: a cursor at or before its own changes
// nothing, and an unknown consumer is not created.
type AckConsumer struct {
	Name    string
	Cursor  stock.Cursor
	Drop    bool
	Forward bool
}

// PruneEvents forgets the order feed's events up to and including
// Through, a cursor of the feed. The leader proposes it; every node then
// refuses the same cursors.
type PruneEvents struct{ Through stock.Cursor }

// CloseSale stops a sale: no new takes, leases or restocks; every lease
// goes back to available.
type CloseSale struct{ SKU string }

// ArchiveSale takes a closed sale's orders out of the ledger (its totals
// stay): allowed once no unit is held and every consumer of the order
// feed has acknowledged the sale's last event. PurgeArchived commands do
// the taking out, in bounded steps.
type ArchiveSale struct{ SKU string }

// PurgeArchived deletes the orders of archived sale SKU among the next
// (at most) Scan order records after order id After; the result's Order
// names where the next step starts (Detail "done" when none is left).
// It walks the records as the file stores them, so nodes whose files
// store orders differently would remove different ones: refused from
// RulesNamedPurges on, applied as before under earlier rules.
type PurgeArchived struct {
	SKU   string
	After string
	Scan  int64
}

// PurgeOrders takes orders of archived sale SKU out of the ledger, by id:
// IDs that are not the sale's, or gone already, are passed over. Then up
// to Entries of a lottery's entries leave. OrdersDone says the proposer
// found none of the sale's orders left beside IDs: the purge ends once
// the entries are out too. A step names what it removes, so every node
// removes the same however its file stores orders (RulesNamedPurges).
type PurgeOrders struct {
	SKU        string
	IDs        []string
	Entries    int64
	OrdersDone bool
}

// PurgeOrdersMax bounds the ids of one PurgeOrders step (about 220 KiB
// of log entry for engine-shaped ids).
const PurgeOrdersMax = 20_000

// TakeEntry is one won deduct inside a Take batch. OrderID is minted by the
// taking node; the ledger ignores an entry whose order id it already holds,
// so a batch may be proposed again after an unknown outcome.
type TakeEntry struct {
	SKU       string `json:"sku"`
	Qty       int64  `json:"qty"`
	User      string `json:"user"`
	RequestID string `json:"req,omitempty"`
	OrderID   string `json:"order"`
	// Ticket is the waiting-room ticket id (32 bytes) whose admission
	// token the deduct carried, on a queued sale: the ledger spends it
	// with the take ("" elsewhere).
	Ticket string `json:"ticket,omitempty"`
}

// EncodedSize is the bytes the entry adds to an encoded Take: callers that
// split batches by size use it.
func (e *TakeEntry) EncodedSize() int {
	n := wire.UvarintLen(len(e.SKU)) + len(e.SKU) + wire.UvarintLen(len(e.User)) + len(e.User) +
		wire.UvarintLen(len(e.RequestID)) + len(e.RequestID) + wire.UvarintLen(len(e.OrderID)) + len(e.OrderID) + wire.MaxVarintBytes
	if e.Ticket != "" {
		n += wire.UvarintLen(len(e.Ticket)) + len(e.Ticket)
	}
	return n
}

// TakeHeaderSize bounds the bytes an encoded Take needs besides its
// entries.
func TakeHeaderSize(node string) int {
	return commandHeaderMax + wire.UvarintLen(len(node)) + len(node) + wire.MaxVarintBytes
}

func (*CreateSale) Op() Op { return OpCreateSale }

func (*Restock) Op() Op { return OpRestock }

func (*Lease) Op() Op { return OpLease }

func (*Return) Op() Op { return OpReturn }

// Op is OpTakeQueued when an entry carries a ticket.
func (c *Take) Op() Op {
	if c.queued {
		return OpTakeQueued
	}
	for i := range c.Entries {
		if c.Entries[i].Ticket != "" {
			return OpTakeQueued
		}
	}
	return OpTake
}

func (*Confirm) Op() Op { return OpConfirm }

func (*Release) Op() Op { return OpRelease }

func (*Reclaim) Op() Op { return OpReclaim }

func (*Register) Op() Op { return OpRegister }

func (*Expire) Op() Op { return OpExpire }

func (*PruneRequests) Op() Op { return OpPruneRequests }

func (*AckConsumer) Op() Op { return OpAckConsumer }

func (*PruneEvents) Op() Op { return OpPruneEvents }

func (*CloseSale) Op() Op { return OpCloseSale }

func (*ArchiveSale) Op() Op { return OpArchiveSale }

func (*PurgeArchived) Op() Op { return OpPurgeArchived }

func (*PurgeOrders) Op() Op { return OpPurgeOrders }

// newCommand returns an empty command of op, or nil for an unknown op.
func newCommand(op Op) Command {
	switch op {
	case OpCreateSale:
		return &CreateSale{}
	case OpRestock:
		return &Restock{}
	case OpLease:
		return &Lease{}
	case OpReturn:
		return &Return{}
	case OpTake:
		return &Take{}
	case OpConfirm:
		return &Confirm{}
	case OpRelease:
		return &Release{}
	case OpReclaim:
		return &Reclaim{}
	case OpRegister:
		return &Register{}
	case OpExpire:
		return &Expire{}
	case OpPruneRequests:
		return &PruneRequests{}
	case OpAckConsumer:
		return &AckConsumer{}
	case OpPruneEvents:
		return &PruneEvents{}
	case OpCloseSale:
		return &CloseSale{}
	case OpArchiveSale:
		return &ArchiveSale{}
	case OpPurgeArchived:
		return &PurgeArchived{}
	case OpEnter:
		return &Enter{}
	case OpDraw:
		return &Draw{}
	case OpSetRules:
		return &SetRules{}
	case OpPurgeOrders:
		return &PurgeOrders{}
	case OpJoin:
		return &Join{}
	case OpQueueTick:
		return &QueueTick{}
	case OpRotateQueueKey:
		return &RotateQueueKey{}
	case OpTakeQueued:
		return &Take{queued: true}
	}
	return nil
}

// commandFormat is the first byte of every binary log entry. A JSON entry
// of an earlier version starts with '{' and is still read.
const commandFormat byte = 0xC1

// commandHeaderMax bounds the format byte, the op and the timestamp.
const commandHeaderMax = 2 + wire.MaxVarintBytes

// EncodeCommand appends c, proposed at atUnixNano, to dst in the binary
// log format: format byte, op, timestamp, then the op's fields.
func EncodeCommand(dst []byte, atUnixNano int64, c Command) []byte {
	dst = append(dst, commandFormat, byte(c.Op()))
	dst = wire.AppendVarint(dst, atUnixNano)
	return c.appendFields(dst)
}

// DecodeCommand parses an entry written by EncodeCommand (or a JSON entry
// of an earlier version). Every error is a malformed entry: retrying it
// cannot help.
func DecodeCommand(b []byte) (atUnixNano int64, c Command, err error) {
	if len(b) > 0 && b[0] == '{' {
		return decodeLegacyCommand(b)
	}
	if len(b) < 2 || b[0] != commandFormat {
		return 0, nil, fmt.Errorf("%w: not a command entry", wire.ErrMalformed)
	}
	op := Op(b[1])
	c = newCommand(op)
	if c == nil {
		return 0, nil, fmt.Errorf("%w: unknown op %d", wire.ErrMalformed, op)
	}
	d := wire.Decoder{B: b[2:]}
	atUnixNano = d.Varint()
	c.decodeFields(&d)
	if err := d.Finish(); err != nil {
		return 0, nil, fmt.Errorf("%s command: %w", op, err)
	}
	return atUnixNano, c, nil
}
