package bench

import (
	"slices"
	"time"
)

// Latencies records request latencies. One recorder belongs to one
// goroutine; Merge combines them when the run is over.
type Latencies struct {
	samples []time.Duration
}

// NewLatencies returns a recorder with room for capacity samples.
func NewLatencies(capacity int) *Latencies {
	return &Latencies{samples: make([]time.Duration, 0, capacity)}
}

// Record adds one sample.
func (l *Latencies) Record(d time.Duration) { l.samples = append(l.samples, d) }

// Merge appends other's samples.
func (l *Latencies) Merge(other *Latencies) { l.samples = append(l.samples, other.samples...) }

// Count is the number of samples.
func (l *Latencies) Count() int { return len(l.samples) }

// Summary holds the percentiles of a set of samples.
type Summary struct {
	Count               int
	P50, P99, P999, Max time.Duration
	Mean                time.Duration
}

// Summarize sorts the samples and returns nearest-rank percentiles: the
// p-th percentile is the smallest sample with at least p % of samples at or
// below it.
func (l *Latencies) Summarize() Summary {
	n := len(l.samples)
	if n == 0 {
		return Summary{}
	}
	slices.Sort(l.samples)
	var sum time.Duration
	for _, d := range l.samples {
		sum += d
	}
	return Summary{
		Count: n,
		P50:   l.percentile(50),
		P99:   l.percentile(99),
		P999:  l.percentile(99.9),
		Max:   l.samples[n-1],
		Mean:  sum / time.Duration(n),
	}
}

// percentile expects sorted samples.
func (l *Latencies) percentile(p float64) time.Duration {
	n := len(l.samples)
	// rank = ceil(p/100 * n), computed in integers to avoid float rounding
	// (99.9 % of 1000 is exactly 999).
	perMille := int64(p*10 + 0.5)
	rank := int((perMille*int64(n) + 999) / 1000)
	rank = min(max(rank, 1), n)
	return l.samples[rank-1]
}
