package raftfsm

import (
	"cmp"
	"fmt"

	"stockd.dev/stockd/raftfsm/command"
	"stockd.dev/stockd/raftfsm/lottery"
	"stockd.dev/stockd/raftfsm/waitroom"
	"stockd.dev/stockd/stock"
)

func (a *applier) createSale(c *command.CreateSale) *command.Result {
	if c.SKU == "" || c.Sale.Total < 0 || c.Sale.PerUser < 0 || c.Sale.HoldTTLNanos < 0 {
		return invalid("create_sale needs a sku and a config with non-negative terms")
	}
	switch c.Sale.Mode {
	case "":
		if c.Sale.EntriesCloseAtUnixNano != 0 {
			return invalid("entries_close_at is for lottery sales")
		}
	case stock.SaleModeLottery:
		if c.Sale.EntriesCloseAtUnixNano <= c.Sale.StartAtUnixNano || c.Sale.PerUser != 0 {
			return invalid("a lottery needs entries_close_at after start_at, and no per_user (one entry per user)")
		}
	default:
		return invalid("unknown sale mode %q", c.Sale.Mode)
	}
	if d := waitroom.CheckConfig(&c.Sale, c.Secret); d != "" || c.Sale.Admission != "" && a.rules < RulesWaitingRoom {
		return invalid("%s", cmp.Or(d, "a waiting room needs the ledger rules of waiting rooms"))
	}
	if s := a.sku(c.SKU); s != nil {
		if s.Config == c.Sale {
			return &command.Result{Outcome: stock.OutcomeSame}
		}
		return &command.Result{Outcome: stock.OutcomeConflict, Detail: fmt.Sprintf("sku %q exists with another config", c.SKU)}
	}
	s := &stock.SKU{SKU: c.SKU, Total: c.Sale.Total, Available: c.Sale.Total, Config: c.Sale, CreatedAtUnixNano: a.at}
	if c.Sale.Mode == stock.SaleModeLottery {
		if len(c.Secret) != lottery.SecretBytes {
			return invalid("a lottery needs a %d-byte secret, got %d", lottery.SecretBytes, len(c.Secret))
		}
		s.Lottery = lottery.New(c.Secret)
	}
	if c.Sale.Admission == stock.AdmissionQueue {
		s.Queue = waitroom.New(c.Secret, a.at)
	}
	a.touched[c.SKU] = s
	a.event(Event{Kind: EventSaleCreated, SKU: c.SKU, Qty: s.Total})
	return &command.Result{Outcome: stock.OutcomeOK}
}
