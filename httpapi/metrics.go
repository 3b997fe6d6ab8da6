package httpapi

import (
	"bytes"
	"fmt"
	"io"
	"maps"
	"slices"
	"stockd.dev/stockd/engine"
	"stockd.dev/stockd/internal/counter"
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

func (h *latencyHistogram) observe(start time.Time) { h.observeN(time.Since(start), 1) }

// requestStart is when fasthttp handed the request over (its one clock
// reading a request, ctx.Time), or now for a context made without it.
func requestStart(ctx *fasthttp.RequestCtx) time.Time {
	if t := ctx.Time(); !t.IsZero() {
		return t
	}
	return time.Now()
}

// observeN counts n answers that each took d (a batch's items).
func (h *latencyHistogram) observeN(d time.Duration, n int) {
	h.counts[counter.Bucket(latencyBucketsSeconds, d.Seconds())].Add(uint64(n))
	h.sumNanos.Add(uint64(n) * uint64(d))
}

func (h *latencyHistogram) write(w io.Writer, name string) {
	counts := make([]uint64, len(h.counts))
	for i := range h.counts {
		counts[i] = h.counts[i].Load()
	}
	writeHistogram(w, name, latencyBucketsSeconds, counts, float64(h.sumNanos.Load())/1e9)
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
	metrics.WriteCounterUint64(&w, "stockd_catch_ups_total", m.CatchUps)
	metrics.WriteCounterUint64(&w, "stockd_catch_up_rounds_total", m.CatchUpRounds)
	metrics.WriteCounterUint64(&w, "stockd_lease_returned_units_total", m.LeaseReturned)
	metrics.WriteCounterUint64(&w, "stockd_lease_reclaimed_units_total", m.LeaseReclaimed)
	metrics.WriteCounterUint64(&w, "stockd_lease_given_back_units_total", m.LeaseGivenBack)
	metrics.WriteCounterUint64(&w, "stockd_take_batch_splits_total", m.TakeSplits)
	metrics.WriteGaugeUint64(&w, "stockd_commit_breaker_open", boolGauge(m.CommitBlocked))
	metrics.WriteCounterUint64(&w, "stockd_holds_expired_units_total", m.HoldsExpired)
	metrics.WriteCounterUint64(&w, "stockd_lottery_entries_total", m.LotteryEntries)
	var driftMax int64
	for _, sku := range slices.Sorted(maps.Keys(m.AuditDrift)) {
		metrics.WriteGaugeUint64(&w, fmt.Sprintf(`stockd_audit_drift_units{sku=%q}`, sku), uint64(m.AuditDrift[sku]))
		driftMax = max(driftMax, m.AuditDrift[sku])
	}
	// The alerts' series: present on every node, 0 when all is well.
	metrics.WriteGaugeUint64(&w, "stockd_audit_drift_units_max", uint64(driftMax))
	metrics.WriteGaugeUint64(&w, "stockd_raft_peers_unreachable", uint64(m.PeersUnreachable))
	metrics.WriteGaugeFloat64(&w, "stockd_audit_duration_seconds", m.AuditSeconds)
	metrics.WriteGaugeUint64(&w, "stockd_proposals_in_flight", uint64(m.ProposalsInFlight))
	metrics.WriteGaugeUint64(&w, "stockd_take_queue_length", uint64(m.TakeQueueLength))
	metrics.WriteGaugeUint64(&w, "stockd_ledger_persist_lag_entries", m.LedgerPersistLagEntries)
	metrics.WriteCounterUint64(&w, "stockd_ledger_persist_failures_total", m.LedgerPersistFailures)
	metrics.WriteGaugeUint64(&w, "stockd_ledger_pending_changes", uint64(m.LedgerPendingChanges))
	metrics.WriteGaugeUint64(&w, "stockd_ledger_file_bytes", uint64(max(m.LedgerFileBytes, 0)))
	if m.AdmissionAdaptive {
		metrics.WriteGaugeUint64(&w, "stockd_admission_limit", uint64(max(m.AdmissionLimit, 0)))
	}
	metrics.WriteGaugeUint64(&w, "stockd_admission_waiting_commit", uint64(max(m.AdmissionInPath, 0)))
	s.writeSaleMetrics(&w, &m)
	s.writeQueueMetrics(&w, &m)
	s.latency.write(&w, "stockd_deduct_duration_seconds")
	writeHistogram(&w, "stockd_take_batch_entries", m.BatchSizeBounds, m.BatchSizeCounts, float64(m.TakeBatchEntries))
	writeHistogram(&w, "stockd_take_commit_seconds", m.CommitBounds, m.CommitCounts, m.CommitSeconds)
	if s.cluster != nil {
		st := s.cluster.Status()
		metrics.WriteGaugeUint64(&w, fmt.Sprintf(`stockd_raft_state{state=%q}`, st.State), 1)
		metrics.WriteGaugeUint64(&w, "stockd_raft_leader_known", boolGauge(st.Leader != ""))
		metrics.WriteGaugeUint64(&w, "stockd_raft_term", st.Term)
		metrics.WriteGaugeUint64(&w, "stockd_raft_commit_index", st.CommitIndex)
		metrics.WriteGaugeUint64(&w, "stockd_raft_applied_index", st.AppliedIndex)
		if st.State != "Leader" && st.LastContact != "" {
			if at, err := time.Parse(time.RFC3339Nano, st.LastContact); err == nil {
				metrics.WriteGaugeFloat64(&w, "stockd_raft_last_contact_seconds", time.Since(at).Seconds())
			}
		}
	}
	if v, err := s.engine.Feed(); err == nil {
		metrics.WriteGaugeUint64(&w, "stockd_feed_head_sequence", v.Head.Seq)
		metrics.WriteGaugeUint64(&w, "stockd_feed_retained_events", v.Retained)
		metrics.WriteGaugeUint64(&w, "stockd_feed_cap_events", v.Cap)
		var lagMax uint64
		for _, c := range v.Consumers {
			metrics.WriteGaugeUint64(&w, fmt.Sprintf(`stockd_feed_consumer_lag_events{consumer=%q}`, c.Name), c.LagEvents)
			metrics.WriteGaugeFloat64(&w, fmt.Sprintf(`stockd_feed_consumer_lag_seconds{consumer=%q}`, c.Name), c.LagSeconds)
			lagMax = max(lagMax, c.LagEvents)
		}
		// Present with no consumer too: 0 consumers, 0 lag.
		metrics.WriteGaugeUint64(&w, "stockd_feed_consumers", uint64(len(v.Consumers)))
		metrics.WriteGaugeUint64(&w, "stockd_feed_consumer_lag_events_max", lagMax)
	}
	metrics.WriteCounterUint64(&w, "stockd_feed_unacknowledged_pruned_events_total", m.FeedUnreadPruned)
	metrics.WriteGaugeUint64(&w, "stockd_feed_at_cap", boolGauge(m.FeedAtCap))
	s.writeOptionalMetrics(&w)
	metrics.WriteProcessMetrics(&w)
	ctx.SetStatusCode(fasthttp.StatusOK)
	ctx.SetContentType("text/plain; version=0.0.4")
	ctx.SetBody(w.Bytes())
}

func boolGauge(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}

// writeHistogram writes a Prometheus histogram from per-bucket counts
// (len(counts) == len(bounds)+1, the last being +Inf).
func writeHistogram(w io.Writer, name string, bounds []float64, counts []uint64, sum float64) {
	if len(counts) != len(bounds)+1 {
		return
	}
	fmt.Fprintf(w, "# TYPE %s histogram\n", name)
	var cum uint64
	for i, ub := range bounds {
		cum += counts[i]
		fmt.Fprintf(w, "%s_bucket{le=\"%g\"} %d\n", name, ub, cum)
	}
	cum += counts[len(bounds)]
	fmt.Fprintf(w, "%s_bucket{le=\"+Inf\"} %d\n", name, cum)
	fmt.Fprintf(w, "%s_sum %g\n", name, sum)
	fmt.Fprintf(w, "%s_count %d\n", name, cum)
}

// writeSaleMetrics writes each sale's series: its tail, its units in the
// buckets, and its remaining and sold units as this node's ledger has them.
func (s *Server) writeSaleMetrics(w *bytes.Buffer, m *engine.Snapshot) {
	for _, sku := range slices.Sorted(maps.Keys(m.Tails)) {
		tail := m.Tails[sku]
		metrics.WriteGaugeFloat64(w, fmt.Sprintf(`stockd_sale_tail_seconds{sku=%q}`, sku), tail.Length().Seconds())
		if !tail.FirstSoldOut.IsZero() {
			metrics.WriteGaugeFloat64(w, fmt.Sprintf(`stockd_sale_first_sold_out_timestamp_seconds{sku=%q}`, sku), float64(tail.FirstSoldOut.UnixNano())/1e9)
		}
		if !tail.LastWin.IsZero() {
			metrics.WriteGaugeFloat64(w, fmt.Sprintf(`stockd_sale_last_win_timestamp_seconds{sku=%q}`, sku), float64(tail.LastWin.UnixNano())/1e9)
		}
	}
	for _, sku := range slices.Sorted(maps.Keys(m.BucketUnits)) {
		metrics.WriteGaugeUint64(w, fmt.Sprintf(`stockd_bucket_units{sku=%q}`, sku), uint64(max(m.BucketUnits[sku], 0)))
		if v, ok := s.engine.SKU(sku); ok { // the sale as this node's ledger has it
			metrics.WriteGaugeUint64(w, fmt.Sprintf(`stockd_sale_remaining_units{sku=%q}`, sku), uint64(max(v.Row.Remaining(), 0)))
			metrics.WriteGaugeUint64(w, fmt.Sprintf(`stockd_sale_sold_units{sku=%q}`, sku), uint64(max(v.Row.Sold, 0)))
		}
	}
}

// writeOptionalMetrics writes the series of the features that may be off
// (scheduled backups, TLS).
func (s *Server) writeOptionalMetrics(w *bytes.Buffer) {
	// A feature that is off says so, so that every series the alerts and
	// the dashboard read exists on every node (deploy/prometheus).
	metrics.WriteGaugeUint64(w, "stockd_backup_enabled", boolGauge(s.cfg.BackupStats != nil))
	if s.cfg.BackupStats == nil {
		metrics.WriteGaugeFloat64(w, "stockd_backup_last_success_timestamp_seconds", 0)
	}
	metrics.WriteGaugeUint64(w, "stockd_tls_enabled", boolGauge(s.cfg.TLSExpiries != nil && len(s.cfg.TLSExpiries()) > 0))
	if s.cfg.TLSExpiries == nil || len(s.cfg.TLSExpiries()) == 0 {
		metrics.WriteGaugeFloat64(w, `stockd_tls_cert_expiry_timestamp_seconds{cert="none"}`, 0)
	}
	metrics.WriteGaugeUint64(w, "stockd_http_event_loop_enabled", boolGauge(s.loop != nil))
	if s.loop != nil {
		s.loop.WriteMetrics(w)
	}
	if s.cfg.BackupStats != nil {
		b := s.cfg.BackupStats()
		last := 0.0
		if !b.LastSuccess.IsZero() {
			last = float64(b.LastSuccess.UnixNano()) / 1e9
		}
		metrics.WriteGaugeFloat64(w, "stockd_backup_last_success_timestamp_seconds", last)
		metrics.WriteGaugeUint64(w, "stockd_backup_last_bytes", uint64(max(b.LastBytes, 0)))
		metrics.WriteCounterUint64(w, "stockd_backups_total", b.Taken)
		metrics.WriteCounterUint64(w, "stockd_backup_failures_total", b.Failures)
	}
	if s.cfg.TLSExpiries != nil {
		for _, e := range s.cfg.TLSExpiries() {
			metrics.WriteGaugeFloat64(w, fmt.Sprintf(`stockd_tls_cert_expiry_timestamp_seconds{cert=%q}`, e.Name), float64(e.NotAfter.Unix()))
		}
	}
}
