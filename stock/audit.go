package stock

import (
	"errors"
	"fmt"
)

// Audit is a recount of one SKU: the row, the orders by state, and whether
// both agree with the conservation law.
type Audit struct {
	OK           bool   `json:"ok"`
	Problem      string `json:"problem,omitempty"`
	AppliedIndex uint64 `json:"applied_index"`
	Row          SKU    `json:"row"`
	OrdersHeld   int64  `json:"orders_held"` // units in held orders
	OrdersSold   int64  `json:"orders_sold"` // units in sold orders (of an archived sale: those still in the ledger)
	Orders       int64  `json:"orders"`      // order records of the SKU
}

// Judge sets OK and Problem: the row obeys the conservation law, and its
// held and sold units are its orders' (an archived sale's sold orders that
// left the ledger count by their units).
func (a *Audit) Judge() {
	var problems []error
	if err := a.Row.CheckLaw(); err != nil {
		problems = append(problems, err)
	}
	if a.OrdersHeld != a.Row.Held || a.OrdersSold+a.Row.ArchivedSold != a.Row.Sold {
		problems = append(problems, fmt.Errorf("orders held %d sold %d, row held %d sold %d",
			a.OrdersHeld, a.OrdersSold, a.Row.Held, a.Row.Sold))
	}
	a.OK, a.Problem = len(problems) == 0, ""
	if !a.OK {
		a.Problem = errors.Join(problems...).Error()
	}
}
