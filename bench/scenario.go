package bench

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"strconv"
	"time"
)

// scenarioNames lists the scenarios in the order a run with -scenario all
// goes through them.
var scenarioNames = []string{"flash", "plentiful", "hot-cold", "retry-storm", "holds"}

// Scenario is a workload: SKUs with their stock, and a deterministic
// sequence of deduct requests. The same scenario value drives every
// strategy, so each sees exactly the same requests.
type Scenario struct {
	Name     string
	SKUs     []string
	Units    []int64 // per SKU
	Requests int
	// HoldTTL > 0: winners hold their units and then confirm, cancel or
	// let the hold expire (only strategies with holds run this scenario).
	HoldTTL time.Duration

	// request i buys for buyer[i] in sku[i]; resend[i] marks a request that
	// repeats an earlier buyer's request id.
	sku    []int32
	buyer  []int32
	resend []bool
	runID  string
}

// TotalUnits is the stock over all SKUs.
func (s *Scenario) TotalUnits() int64 {
	var n int64
	for _, u := range s.Units {
		n += u
	}
	return n
}

// Request is one deduct attempt.
type Request struct {
	SKU       int // index into Scenario.SKUs
	Buyer     int
	Qty       int64
	Resend    bool
	RequestID string
	User      string
}

// Request returns the i-th request.
func (s *Scenario) Request(i int) Request {
	b := int(s.buyer[i])
	// One allocation for both ids: "u<b>" and "<run>-<scenario>-<b>".
	buf := make([]byte, 0, 2*20+len(s.runID)+len(s.Name)+3)
	buf = strconv.AppendInt(append(buf, 'u'), int64(b), 10)
	user := len(buf)
	ids := string(strconv.AppendInt(append(append(append(append(buf, s.runID...), '-'), s.Name...), '-'), int64(b), 10))
	return Request{
		SKU: int(s.sku[i]), Buyer: b, Qty: 1, Resend: s.resend[i],
		RequestID: ids[user:], User: ids[:user],
	}
}

// NewScenario builds a named scenario from the options; runID keeps SKU
// names and request ids unique across runs against the same servers.
func NewScenario(name string, o *Options, runID string) (*Scenario, error) {
	n := o.Requests
	s := &Scenario{Name: name, Requests: n, runID: runID,
		sku: make([]int32, n), buyer: make([]int32, n), resend: make([]bool, n)}
	rng := rand.New(rand.NewPCG(1, 2)) // the same sequence in every run
	for i := range s.buyer {
		s.buyer[i] = int32(i)
	}
	single := func(units int64) {
		s.SKUs = []string{fmt.Sprintf("%s-%s", name, runID)}
		s.Units = []int64{units}
	}
	switch name {
	case "flash":
		single(o.Units)
	case "plentiful":
		single(2 * int64(n))
	case "hot-cold":
		for k := 0; k < o.SKUs; k++ {
			s.SKUs = append(s.SKUs, fmt.Sprintf("%s-%s-%d", name, runID, k))
			s.Units = append(s.Units, o.Units)
		}
		z := newZipf(rng, o.ZipfS, o.SKUs)
		for i := range s.sku {
			s.sku[i] = int32(z.next())
		}
	case "retry-storm":
		single(o.Units)
		for i := 1; i < n; i++ {
			if rng.Float64() < o.RetryShare {
				// Re-send a recent request: a client retrying after a
				// timeout, with the same request_id.
				j := max(0, i-1-rng.IntN(min(i, 1000)))
				s.buyer[i], s.resend[i] = s.buyer[j], true
			}
		}
	case "holds":
		single(o.Units)
		s.HoldTTL = o.HoldTTL
	default:
		return nil, fmt.Errorf("unknown scenario %q", name)
	}
	return s, nil
}

// HoldFate says what the winner of request i does with a hold: 0 confirm
// (half), 1 cancel (a quarter), 2 let it expire (a quarter).
func (s *Scenario) HoldFate(i int) int {
	switch s.buyer[i] % 4 {
	case 0, 1:
		return 0
	case 2:
		return 1
	}
	return 2
}

// zipf draws SKU indexes with P(k) proportional to 1/(k+1)^s.
type zipf struct {
	rng *rand.Rand
	cdf []float64
}

func newZipf(rng *rand.Rand, s float64, n int) *zipf {
	z := &zipf{rng: rng, cdf: make([]float64, n)}
	var sum float64
	for k := 0; k < n; k++ {
		sum += 1 / math.Pow(float64(k+1), s)
		z.cdf[k] = sum
	}
	for k := range z.cdf {
		z.cdf[k] /= sum
	}
	return z
}

func (z *zipf) next() int {
	u := z.rng.Float64()
	return min(sort.SearchFloat64s(z.cdf, u), len(z.cdf)-1)
}
