package engine

import (
	"stockd.dev/stockd/stock"
	"sync"
)

// turnedDownMax bounds the memory of orders a node answered as accepted
// (wait=none) and the ledger then turned down: enough for a sale's worth
// of buyers to read their order's fate for a while.
const turnedDownMax = 100_000

// turnedDown remembers, per node, the pending orders the ledger did not
// take, so GET /v1/orders/{id} answers "released" with the reason instead
// of 404, and the pending orders that turned out to repeat a request id
// another node had already won with (the ledger's order, under the id this
// node answered), and, as pending, the orders of takes whose fate stays
// open (fateOpen): the ledger, asked first, answers once it holds one.
// Oldest entries are forgotten first. Safe for concurrent use; only
// the losing end of a wait=none take touches it.
type turnedDown struct {
	mu    sync.Mutex
	byID  map[string]stock.Order
	order []string // ring of ids in insertion order
	next  int
}

func newTurnedDown() *turnedDown {
	return &turnedDown{byID: make(map[string]stock.Order)}
}

func (t *turnedDown) add(o stock.Order) { t.put(o.ID, o) }

// put remembers o under id.
func (t *turnedDown) put(id string, o stock.Order) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.order) < turnedDownMax {
		t.order = append(t.order, id)
	} else {
		delete(t.byID, t.order[t.next])
		t.order[t.next] = id
		t.next = (t.next + 1) % turnedDownMax
	}
	t.byID[id] = o
}

func (t *turnedDown) get(id string) (stock.Order, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	o, ok := t.byID[id]
	return o, ok
}
