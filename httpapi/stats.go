package httpapi

import (
	"bytes"
	_ "embed"
	"time"

	"github.com/valyala/fasthttp"
)

// The operator's page (docs/operations.md, "The operator's page"): GET /ui is one
// self-contained page, embedded here, that polls GET /v1/stats. The stats
// are read from atomics and the ledger's mirrors: no lock on the deduct
// path is taken for them.

//go:embed ui/index.html
var uiPage []byte

// The buyer's page of a queued sale (docs/waiting-room.md, "The buyer's
// page"): GET /q/{sku}?user=... serves it, the same page for every sale;
// it reads the sale's name from its own address.
//
//go:embed ui/queue.html
var buyerPage []byte

var pathBuyerPage = []byte("/q/")

// handlePage serves /ui and /q/{sku}.
func (s *Server) handlePage(ctx *fasthttp.RequestCtx, path []byte) {
	sku, buyer := bytes.CutPrefix(path, pathBuyerPage)
	switch {
	case !buyer:
		writePage(ctx, uiPage)
	case !validID(sku):
		writeRaw(ctx, fasthttp.StatusNotFound, bodyBadSKU)
	default:
		writePage(ctx, buyerPage)
	}
}

// writePage answers one of the embedded pages.
func writePage(ctx *fasthttp.RequestCtx, page []byte) {
	ctx.SetStatusCode(fasthttp.StatusOK)
	ctx.SetContentType("text/html; charset=utf-8")
	ctx.Response.Header.Set("Cache-Control", "no-cache")
	// The pages load nothing from elsewhere, call only this node, and
	// nothing may frame them.
	ctx.Response.Header.Set("Content-Security-Policy", "default-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; frame-ancestors 'none'")
	ctx.SetBody(page)
}

// statsSKU is one sale on the page.
type statsSKU struct {
	SKU        string           `json:"sku"`
	State      string           `json:"state"`
	Total      int64            `json:"total"`
	Remaining  int64            `json:"remaining"`
	Available  int64            `json:"available"`
	Held       int64            `json:"held"`
	Sold       int64            `json:"sold"`
	Leased     map[string]int64 `json:"leased"`
	Buckets    int64            `json:"buckets"` // units in this node's buckets
	AuditDrift int64            `json:"audit_drift"`
	Archived   bool             `json:"archived,omitempty"`
	// Lottery is a lottery sale's state, entries and winners.
	Lottery *lotteryJSON `json:"lottery,omitempty"`
	// Queue is a queued sale's waiting room.
	Queue *queueResponse `json:"queue,omitempty"`
}

// statsResponse is GET /v1/stats: what the operator's page shows, as
// counters since the node started (the page turns them into rates).
type statsResponse struct {
	NodeID string `json:"node_id"`
	AtMs   int64  `json:"at_ms"`
	// Cluster is this node's view, each peer asked for its own state;
	// absent for a node without raft status.
	Cluster *ClusterStatus `json:"cluster,omitempty"`
	SKUs    []statsSKU     `json:"skus"`
	// Deducts by outcome, since start; LatencyBuckets are the upper bounds
	// (seconds) of LatencyCounts (the last count is above them all).
	Deducts        map[string]uint64 `json:"deducts"`
	LatencyBuckets []float64         `json:"latency_buckets"`
	LatencyCounts  []uint64          `json:"latency_counts"`
	CommitBlocked  bool              `json:"commit_blocked"`
	// AdmissionLimit bounds the deducts waiting for the ledger
	// (AdmissionWaiting); 0 when admission does not follow the ledger.
	AdmissionLimit   int64  `json:"admission_limit"`
	AdmissionWaiting int64  `json:"admission_waiting"`
	PersistLag       uint64 `json:"persist_lag_entries"`
	// TLSNearest is the certificate in use that expires first.
	TLSNearest   *certExpiryJSON `json:"tls_nearest_expiry,omitempty"`
	FeedHead     string          `json:"feed_head"`
	FeedRetained uint64          `json:"feed_retained"`
	Consumers    []consumerJSON  `json:"consumers"`
}

func (s *Server) handleStats(ctx *fasthttp.RequestCtx) {
	m := s.engine.MetricsSnapshot()
	out := statsResponse{AtMs: time.Now().UnixMilli(), Deducts: m.DeductsByStatus,
		LatencyBuckets: latencyBucketsSeconds, CommitBlocked: m.CommitBlocked, PersistLag: m.LedgerPersistLagEntries,
		SKUs: []statsSKU{}, Consumers: []consumerJSON{}, AdmissionWaiting: m.AdmissionInPath}
	if m.AdmissionAdaptive {
		out.AdmissionLimit = m.AdmissionLimit
	}
	if e, ok := s.nearestExpiry(); ok {
		out.TLSNearest = &certExpiryJSON{Name: e.Name, NotAfter: e.NotAfter.UTC().Format(time.RFC3339)}
	}
	if s.cluster != nil {
		st := s.clusterStatus()
		out.Cluster, out.NodeID = &st, st.NodeID
	}
	var told map[string]float64
	for _, v := range s.engine.SKUViews() {
		r := v.Row
		leased := r.Leased
		if leased == nil {
			leased = map[string]int64{}
		}
		out.SKUs = append(out.SKUs, statsSKU{SKU: r.SKU, State: v.State, Total: r.Total, Remaining: r.Remaining(),
			Available: r.Available, Held: r.Held, Sold: r.Sold, Leased: leased, Buckets: max(m.BucketUnits[r.SKU], 0),
			AuditDrift: m.AuditDrift[r.SKU], Archived: r.Archived, Lottery: lotteryView(&r)})
		if r.Queue != nil {
			if told == nil {
				told = s.engine.QueueCounters().SoldOutTold
			}
			if qv, _, err := s.engine.Queue(r.SKU); err == nil {
				q := s.queueJSON(&qv, told)
				out.SKUs[len(out.SKUs)-1].Queue = &q
			}
		}
	}
	out.LatencyCounts = make([]uint64, len(s.latency.counts))
	for i := range s.latency.counts {
		out.LatencyCounts[i] = s.latency.counts[i].Load()
	}
	if v, err := s.engine.Feed(); err == nil {
		out.FeedHead, out.FeedRetained = v.Head.String(), v.Retained
		out.Consumers = consumersJSON(v.Consumers)

	}
	writeJSON(ctx, fasthttp.StatusOK, out)
}

type certExpiryJSON struct {
	Name     string `json:"name"`
	NotAfter string `json:"not_after"`
}

// nearestExpiry is the certificate in use that expires first.
func (s *Server) nearestExpiry() (CertExpiry, bool) {
	if s.cfg.TLSExpiries == nil {
		return CertExpiry{}, false
	}
	var nearest CertExpiry
	for _, e := range s.cfg.TLSExpiries() {
		if nearest.Name == "" || e.NotAfter.Before(nearest.NotAfter) {
			nearest = e
		}
	}
	return nearest, nearest.Name != ""
}
