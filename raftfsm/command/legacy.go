package command

import (
	"encoding/json"
	"fmt"
	"stockd.dev/stockd/internal/wire"
	"stockd.dev/stockd/stock"
)

// Legacy is the JSON log entry of versions before the binary
// format: one struct for every op. Raft logs written by them are still
// replayed.
type Legacy struct {
	Op             Op                `json:"op"`
	AtUnixNano     int64             `json:"at"`
	Node           string            `json:"node"`
	SKU            string            `json:"sku"`
	Qty            int64             `json:"qty"`
	Sale           *stock.SaleConfig `json:"sale"`
	Takes          []TakeEntry       `json:"takes"`
	OrderID        string            `json:"order"`
	Reason         string            `json:"reason"`
	Addr           string            `json:"addr"`
	OrderIDs       []string          `json:"orders"`
	BeforeUnixNano int64             `json:"before"`
	MaxKeep        int64             `json:"max_keep"`
}

func decodeLegacyCommand(b []byte) (int64, Command, error) {
	var l Legacy
	if err := json.Unmarshal(b, &l); err != nil {
		return 0, nil, fmt.Errorf("%w: json command: %v", wire.ErrMalformed, err)
	}
	c, err := l.Typed()
	return l.AtUnixNano, c, err
}

// typed returns the typed command the legacy entry stands for.
func (l *Legacy) Typed() (Command, error) {
	var c Command
	switch l.Op {
	case OpCreateSale:
		cs := &CreateSale{SKU: l.SKU}
		if l.Sale != nil {
			cs.Sale = *l.Sale
		} else {
			cs.Sale.Total = -1 // refused by Apply as before
		}
		c = cs
	case OpRestock:
		c = &Restock{SKU: l.SKU, Qty: l.Qty}
	case OpLease:
		c = &Lease{Node: l.Node, SKU: l.SKU, Want: l.Qty}
	case OpReturn:
		c = &Return{Node: l.Node, SKU: l.SKU, Qty: l.Qty}
	case OpTake:
		c = &Take{Node: l.Node, Entries: l.Takes}
	case OpConfirm:
		c = &Confirm{OrderID: l.OrderID}
	case OpRelease:
		c = &Release{OrderID: l.OrderID, Reason: l.Reason}
	case OpReclaim:
		c = &Reclaim{Node: l.Node}
	case OpRegister:
		c = &Register{Node: l.Node, Addr: l.Addr}
	case OpExpire:
		c = &Expire{OrderIDs: l.OrderIDs}
	case OpPruneRequests:
		c = &PruneRequests{BeforeUnixNano: l.BeforeUnixNano, MaxKeep: l.MaxKeep}
	default:
		return nil, fmt.Errorf("%w: unknown op %d", wire.ErrMalformed, l.Op)
	}
	return c, nil
}
