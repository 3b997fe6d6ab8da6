package engine

import (
	"bytes"
	"fmt"
	"time"

	"stockd.dev/stockd/raftfsm/command"
	"stockd.dev/stockd/raftfsm/lottery"
	"stockd.dev/stockd/stock"
)

// The engine's tests make their sales through the log, as the control
// plane (package engine/control, which imports this one) does; its rules
// (validation, error mapping) are tested there.

// SaleSpec is a sale the tests make.
type SaleSpec struct {
	Total          int64
	StartAt        time.Time
	PerUser        int64
	HoldTTL        time.Duration
	Lottery        bool
	EntriesCloseAt time.Time
}

// CreateSale proposes the sale; created is false for a repeat.
func (e *Engine) CreateSale(sku string, spec SaleSpec) (created bool, err error) {
	cmd := &command.CreateSale{SKU: sku, Sale: stock.SaleConfig{Total: spec.Total, PerUser: spec.PerUser, HoldTTLNanos: int64(spec.HoldTTL)}}
	if !spec.StartAt.IsZero() {
		cmd.Sale.StartAtUnixNano = spec.StartAt.UnixNano()
	}
	if spec.Lottery {
		cmd.Sale.Mode, cmd.Sale.EntriesCloseAtUnixNano = stock.SaleModeLottery, spec.EntriesCloseAt.UnixNano()
		cmd.Secret = bytes.Repeat([]byte{7}, lottery.SecretBytes)
	}
	res, err := e.Propose(cmd)
	switch {
	case err != nil:
		return false, err
	case res.Outcome != stock.OutcomeOK && res.Outcome != stock.OutcomeSame:
		return false, fmt.Errorf("create sale %q: %s %s", sku, res.Outcome, res.Detail)
	}
	return res.Outcome == stock.OutcomeOK, nil
}

// Restock proposes qty more units of sku, and holds its answer as the
// control plane does.
func (e *Engine) Restock(sku string, qty int64) error {
	res, err := e.Propose(&command.Restock{SKU: sku, Qty: qty})
	switch {
	case err != nil:
		return err
	case res.Outcome != stock.OutcomeOK:
		return fmt.Errorf("restock %q: %s %s", sku, res.Outcome, res.Detail)
	}
	e.HoldAck()
	return nil
}
