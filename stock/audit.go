package stock

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
