package stock

import (
	"fmt"
	"maps"
	"strconv"
)

// SKU is one sale's row of the ledger. The conservation law holds for it
// after every applied entry:
//
//	Total == Available + Σ Leased[n] + Held + Sold, every term >= 0
type SKU struct {
	SKU               string           `json:"sku"`
	Total             int64            `json:"total"`
	Available         int64            `json:"available"`
	Leased            map[string]int64 `json:"leased,omitempty"`
	Held              int64            `json:"held"`
	Sold              int64            `json:"sold"`
	Config            SaleConfig       `json:"config"`
	CreatedAtUnixNano int64            `json:"created_at"`
	// ClosedAtUnixNano: the sale was closed then (0: open). A closed sale
	// takes no new deducts, leases or restocks; its holds may still be
	// confirmed until they expire.
	ClosedAtUnixNano int64 `json:"closed_at,omitempty"`
	// Archived: the sale's orders are leaving (or have left) the ledger;
	// its totals stay. ArchivedOrders counts the orders taken out, and
	// PurgeDone says none is left.
	Archived       bool   `json:"archived,omitempty"`
	ArchivedOrders int64  `json:"archived_orders,omitempty"`
	ArchivedSold   int64  `json:"archived_sold,omitempty"` // units of the sold orders taken out
	PurgeAfter     string `json:"purge_after,omitempty"`   // the order id the purge has scanned up to
	PurgeDone      bool   `json:"purge_done,omitempty"`
	// LastEventSeq is the order feed's last event about this sale: it may
	// be archived once every consumer has acknowledged it.
	LastEventSeq uint64 `json:"last_event_seq,omitempty"`
	// Lottery is set for a lottery sale (Config.Mode SaleModeLottery).
	Lottery *Lottery `json:"lottery,omitempty"`
	// Queue is set for a sale behind a waiting room (Config.Admission
	// AdmissionQueue).
	Queue *Queue `json:"queue,omitempty"`
}

// Closed reports whether the sale was closed.
func (s *SKU) Closed() bool { return s.ClosedAtUnixNano != 0 }

// LeasedTotal is Σ Leased[n].
func (s *SKU) LeasedTotal() int64 {
	var n int64
	for _, v := range s.Leased {
		n += v
	}
	return n
}

// Remaining is what buyers can still win: Total − Held − Sold.
func (s *SKU) Remaining() int64 { return s.Total - s.Held - s.Sold }

// CheckLaw returns an error naming the terms when the conservation law or
// non-negativity is broken.
func (s *SKU) CheckLaw() error {
	if s.Total < 0 || s.Available < 0 || s.Held < 0 || s.Sold < 0 {
		return fmt.Errorf("sku %q has a negative term: total %d available %d held %d sold %d",
			s.SKU, s.Total, s.Available, s.Held, s.Sold)
	}
	for n, v := range s.Leased {
		if v < 0 {
			return fmt.Errorf("sku %q: leased[%s] = %d < 0", s.SKU, n, v)
		}
	}
	if sum := s.Available + s.LeasedTotal() + s.Held + s.Sold; sum != s.Total {
		return fmt.Errorf("sku %q breaks conservation: total %d != available %d + leased %d + held %d + sold %d",
			s.SKU, s.Total, s.Available, s.LeasedTotal(), s.Held, s.Sold)
	}
	return nil
}

// Clone is a copy of the row that shares nothing it may change.
func (s *SKU) Clone() *SKU {
	c := *s
	c.Leased = maps.Clone(s.Leased)
	if s.Lottery != nil {
		lt := *s.Lottery // its slices are replaced, never changed in place
		c.Lottery = &lt
	}
	if s.Queue != nil {
		q := *s.Queue // its slices are replaced, never changed in place
		c.Queue = &q
	}
	return &c
}

// SaleConfig is what an operator sets when creating a sale.
type SaleConfig struct {
	Total           int64 `json:"total"`
	StartAtUnixNano int64 `json:"start_at,omitempty"`
	PerUser         int64 `json:"per_user,omitempty"`
	HoldTTLNanos    int64 `json:"hold_ttl,omitempty"`
	// Mode is "" for first come, first served, or SaleModeLottery, whose
	// entries close at EntriesCloseAtUnixNano.
	Mode                   string `json:"mode,omitempty"`
	EntriesCloseAtUnixNano int64  `json:"entries_close_at,omitempty"`
	// Admission is "" for a sale anyone may buy from, or AdmissionQueue
	// for one behind a waiting room: QueueOveradmitMilli is its
	// queue_overadmit in thousandths (tokens out stay under
	// ceil(overadmit × remaining)), QueueAdmitTTLNanos how long a token
	// is valid.
	Admission           string `json:"admission,omitempty"`
	QueueOveradmitMilli int64  `json:"queue_overadmit_milli,omitempty"`
	QueueAdmitTTLNanos  int64  `json:"queue_admit_ttl,omitempty"`
}

// SaleModeLottery is SaleConfig.Mode of a lottery sale.
const SaleModeLottery = "lottery"

// Lottery is a lottery sale's part of its row.
type Lottery struct {
	Seed           []byte `json:"seed"`      // revealed by the draw
	OrderKey       []byte `json:"order_key"` // never shown
	SeedCommitment []byte `json:"seed_commitment"`
	Entries        int64  `json:"entries"`
	EntriesHash    []byte `json:"entries_hash"`
	// DrawnAtUnixNano: the draw happened then (0: not yet). Winners won
	// at the draw; Promoted waitlisted entries won since, as winners'
	// units came back.
	DrawnAtUnixNano int64 `json:"drawn_at,omitempty"`
	Winners         int64 `json:"winners,omitempty"`
	Promoted        int64 `json:"promoted,omitempty"`
	// WaitlistLostAtUnixNano: no unit can come back since then (every
	// winner's order sold, or the sale closed): the waitlist lost.
	WaitlistLostAtUnixNano int64 `json:"waitlist_lost_at,omitempty"`
	// PurgedEntries counts the entries an archive took out (from seq 1).
	PurgedEntries int64 `json:"purged_entries,omitempty"`
}

// Drawn reports whether the draw happened.
func (l *Lottery) Drawn() bool { return l.DrawnAtUnixNano != 0 }

// Won is the number of entries that won: at the draw and since.
func (l *Lottery) Won() int64 { return l.Winners + l.Promoted }

// Entry is one committed lottery entry.
type Entry struct {
	SKU        string `json:"sku"`
	Seq        int64  `json:"seq"`
	User       string `json:"user"`
	RequestID  string `json:"request_id,omitempty"`
	AtUnixNano int64  `json:"at"`
}

// ID is the entry's id on the wire: its sequence in the sale.
func (e *Entry) ID() string { return strconv.FormatInt(e.Seq, 10) }
