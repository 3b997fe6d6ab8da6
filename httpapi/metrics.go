package httpapi

import (
	"bytes"
	"fmt"
	"io"
	"maps"
	"slices"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/valyala/fasthttp"
)

// latencyBucketsSeconds are the upper bounds of the deduct latency
// histogram: from the sold-out fast path (tens of microseconds) to a slow
// commit.
var latencyBucketsSeconds = []float64{
	0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10,
}

// latencyHistogram is a Prometheus histogram kept in atomics: the deduct
// path must not take a mutex, which the usual client libraries' histograms
// do.
type latencyHistogram struct {
	counts   []atomic.Uint64 // one per bucket, plus +Inf
	sumNanos atomic.Uint64
}

func newLatencyHistogram() *latencyHistogram {
	return &latencyHistogram{counts: make([]atomic.Uint64, len(latencyBucketsSeconds)+1)}
}

func (h *latencyHistogram) observe(start time.Time) {
	d := time.Since(start)
	sec := d.Seconds()
	i := 0
	for i < len(latencyBucketsSeconds) && sec > latencyBucketsSeconds[i] {
		i++
	}
	h.counts[i].Add(1)
	h.sumNanos.Add(uint64(d))
}

func (h *latencyHistogram) write(w io.Writer, name string) {
	fmt.Fprintf(w, "# TYPE %s histogram\n", name)
	var cum uint64
	for i, ub := range latencyBucketsSeconds {
		cum += h.counts[i].Load()
		fmt.Fprintf(w, "%s_bucket{le=\"%g\"} %d\n", name, ub, cum)
	}
	cum += h.counts[len(latencyBucketsSeconds)].Load()
	fmt.Fprintf(w, "%s_bucket{le=\"+Inf\"} %d\n", name, cum)
	fmt.Fprintf(w, "%s_sum %g\n", name, float64(h.sumNanos.Load())/1e9)
	fmt.Fprintf(w, "%s_count %d\n", name, cum)
}

func (s *Server) handleMetrics(ctx *fasthttp.RequestCtx) {
	var w bytes.Buffer
	m := s.engine.MetricsSnapshot()
	for _, status := range slices.Sorted(maps.Keys(m.DeductsByStatus)) {
		metrics.WriteCounterUint64(&w, fmt.Sprintf(`stockd_deducts_total{outcome=%q}`, status), m.DeductsByStatus[status])
	}
	metrics.WriteCounterUint64(&w, "stockd_take_batches_total", m.TakeBatches)
	metrics.WriteCounterUint64(&w, "stockd_take_batch_entries_total", m.TakeBatchEntries)
	metrics.WriteCounterUint64(&w, "stockd_take_retries_total", m.TakeRetries)
	metrics.WriteCounterUint64(&w, "stockd_lease_granted_units_total", m.LeaseGranted)
	metrics.WriteCounterUint64(&w, "stockd_lease_errors_total", m.LeaseErrors)
	metrics.WriteCounterUint64(&w, "stockd_lease_short_takes_total", m.LeaseShort)
	metrics.WriteGaugeUint64(&w, "stockd_proposals_in_flight", uint64(m.ProposalsInFlight))
	metrics.WriteGaugeUint64(&w, "stockd_take_queue_length", uint64(m.TakeQueueLength))
	for _, sku := range slices.Sorted(maps.Keys(m.BucketUnits)) {
		metrics.WriteGaugeUint64(&w, fmt.Sprintf(`stockd_bucket_units{sku=%q}`, sku), uint64(max(m.BucketUnits[sku], 0)))
	}
	s.latency.write(&w, "stockd_deduct_duration_seconds")
	if s.cluster != nil {
		st := s.cluster.Status()
		metrics.WriteGaugeUint64(&w, fmt.Sprintf(`stockd_raft_state{state=%q}`, st.State), 1)
		metrics.WriteGaugeUint64(&w, "stockd_raft_term", st.Term)
		metrics.WriteGaugeUint64(&w, "stockd_raft_commit_index", st.CommitIndex)
		metrics.WriteGaugeUint64(&w, "stockd_raft_applied_index", st.AppliedIndex)
	}
	metrics.WriteProcessMetrics(&w)
	ctx.SetStatusCode(fasthttp.StatusOK)
	ctx.SetContentType("text/plain; version=0.0.4")
	ctx.SetBody(w.Bytes())
}
