package bench

import (
	"context"
	"sync"
	"sync/atomic"

	"stockd.dev/stockd/shard"
)

// strategyNames lists every strategy in table order.
var strategyNames = []string{
	"stockd-commit", "stockd-none", "stockd-batch", "noop",
	"inproc-mutex", "inproc-atomic", "inproc-buckets",
	"redis-lua", "pg-optimistic", "pg-pessimistic",
}

// Outcome is a strategy's answer to one deduct.
type Outcome struct {
	Win     bool
	OrderID string // set on a win when the strategy has order ids
	Reason  string // on a loss: sold_out, user_limit, ...
	Err     error  // transport or server failure: neither win nor loss
}

// Final is a strategy's own count once the run is over.
type Final struct {
	Sold      int64 // units the strategy's store says it sold (or holds for buyers)
	Remaining int64 // units its store still offers
	Valid     bool  // its own consistency check passed (e.g. stockd's audit)
	Detail    string
}

// Strategy is one way to sell stock. Setup runs before the load, Deduct
// from many goroutines at once (worker is the caller's index, stable for
// a worker), Final after it.
type Strategy interface {
	Name() string
	Durability() string
	// Supports says why a scenario cannot run, or "" when it can.
	Supports(s *Scenario) string
	Setup(ctx context.Context, s *Scenario) error
	Deduct(ctx context.Context, worker int, r *Request) Outcome
	// AfterWin lets a holds scenario confirm (fate 0) or cancel (fate 1) a
	// won hold; kept reports a confirmed sale.
	AfterWin(ctx context.Context, worker int, r *Request, orderID string, fate int) (kept bool, err error)
	// Remaining is sampled during the run for the stock-over-time chart.
	Remaining(ctx context.Context) (int64, error)
	Final(ctx context.Context) (Final, error)
	Close() error
}

// verifier is implemented by strategies that answer before they commit
// (stockd wait=none): Verify counts the distinct orders the won ids
// resolve to at the end (the wins the oversell check may count), and the
// won ids that resolve to no order (accepted, then turned down).
type verifier interface {
	Verify(ctx context.Context, orderIDs []string) (kept, unresolved int, err error)
}

// noHolds is embedded by strategies without holds.
type noHolds struct{}

func (noHolds) AfterWin(context.Context, int, *Request, string, int) (bool, error) { return true, nil }

func supportsNoHolds(s *Scenario) string {
	if s.HoldTTL > 0 {
		return "has no holds"
	}
	return ""
}

// inprocStrategy keeps stock in this process: the cost of the counter
// alone, without network or durability.
type inprocStrategy struct {
	noHolds
	name  string
	units []int64 // initial stock per SKU
	take  func(sku, worker int, qty int64) bool
	left  func(sku int) int64
	// dedupe remembers request ids, as every real strategy here does.
	seen sync.Map
	sold atomic.Int64
}

func (p *inprocStrategy) Name() string                { return p.name }
func (p *inprocStrategy) Durability() string          { return "none (memory)" }
func (p *inprocStrategy) Supports(s *Scenario) string { return supportsNoHolds(s) }
func (p *inprocStrategy) Close() error                { return nil }

func (p *inprocStrategy) Deduct(_ context.Context, worker int, r *Request) Outcome {
	if _, dup := p.seen.Load(r.RequestID); dup {
		return Outcome{Win: true, OrderID: r.RequestID}
	}
	if !p.take(r.SKU, worker, r.Qty) {
		return Outcome{Reason: "sold_out"}
	}
	if _, dup := p.seen.LoadOrStore(r.RequestID, true); dup {
		p.take(r.SKU, worker, -r.Qty) // a concurrent repeat won first: give back
		return Outcome{Win: true, OrderID: r.RequestID}
	}
	p.sold.Add(r.Qty)
	return Outcome{Win: true, OrderID: r.RequestID}
}

func (p *inprocStrategy) Remaining(context.Context) (int64, error) {
	var n int64
	for k := range p.units {
		n += p.left(k)
	}
	return n, nil
}

func (p *inprocStrategy) Final(ctx context.Context) (Final, error) {
	left, _ := p.Remaining(ctx)
	var total int64
	for _, u := range p.units {
		total += u
	}
	return Final{Sold: p.sold.Load(), Remaining: left, Valid: left >= 0 && p.sold.Load()+left == total}, nil
}

func newInprocMutex() Strategy {
	var mu sync.Mutex
	var counts []int64
	p := &inprocStrategy{name: "inproc-mutex"}
	p.take = func(sku, _ int, qty int64) bool {
		mu.Lock()
		defer mu.Unlock()
		if counts[sku] < qty {
			return false
		}
		counts[sku] -= qty
		return true
	}
	p.left = func(sku int) int64 {
		mu.Lock()
		defer mu.Unlock()
		return counts[sku]
	}
	return &setupInproc{inprocStrategy: p, init: func(units []int64) {
		counts = append([]int64(nil), units...)
		p.units = units
	}}
}

// newInprocAtomic is one shared atomic counter per SKU, decremented with
// CAS: the buckets with a single bucket.
func newInprocAtomic() Strategy { return newInprocShards("inproc-atomic", 1) }

// newInprocBuckets is stockd's per-core buckets with a sticky hint.
func newInprocBuckets() Strategy { return newInprocShards("inproc-buckets", 16) }

func newInprocShards(name string, shards int) Strategy {
	var buckets []*shard.Buckets
	p := &inprocStrategy{name: name}
	p.take = func(sku, worker int, qty int64) bool {
		if qty < 0 {
			buckets[sku].Put(uint32(worker), -qty)
			return true
		}
		return buckets[sku].Take(uint32(worker), qty)
	}
	p.left = func(sku int) int64 { return buckets[sku].Units() }
	return &setupInproc{inprocStrategy: p, init: func(units []int64) {
		buckets = make([]*shard.Buckets, len(units))
		for k, u := range units {
			buckets[k] = shard.New(shards)
			if u > 0 {
				buckets[k].Load(u)
			}
		}
		p.units = units
	}}
}

// setupInproc gives an in-process strategy its Setup.
type setupInproc struct {
	*inprocStrategy
	init func(units []int64)
}

func (s *setupInproc) Setup(_ context.Context, sc *Scenario) error {
	s.seen = sync.Map{}
	s.sold.Store(0)
	s.init(sc.Units)
	return nil
}
