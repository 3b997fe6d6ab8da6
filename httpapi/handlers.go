package httpapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"stockd.dev/stockd/engine/control"

	"github.com/valyala/fasthttp"

	"stockd.dev/stockd/engine"
	"stockd.dev/stockd/stock"
)

// saleRequest is the body of PUT /v1/skus/{sku}.
type saleRequest struct {
	Total   *int64 `json:"total"`
	StartAt string `json:"start_at,omitempty"`
	PerUser int64  `json:"per_user,omitempty"`
	HoldTTL string `json:"hold_ttl,omitempty"`
	// Mode "lottery" takes entries until EntriesCloseAt, then draws.
	Mode           string `json:"mode,omitempty"`
	EntriesCloseAt string `json:"entries_close_at,omitempty"`
	// Admission "queue" puts the sale behind a waiting room.
	Admission      string       `json:"admission,omitempty"`
	QueueOveradmit *json.Number `json:"queue_overadmit,omitempty"`
	QueueAdmitTTL  string       `json:"queue_admit_ttl,omitempty"`
}

// skuResponse is GET /v1/skus/{sku}.
type skuResponse struct {
	SKU       string `json:"sku"`
	Total     int64  `json:"total"`
	Remaining int64  `json:"remaining"`
	Available int64  `json:"available"`
	Leased    int64  `json:"leased"`
	Held      int64  `json:"held"`
	Sold      int64  `json:"sold"`
	State     string `json:"state"`
	StartAt   string `json:"start_at,omitempty"`
	StartsIn  int64  `json:"starts_in_ms,omitempty"`
	PerUser   int64  `json:"per_user,omitempty"`
	HoldTTL   string `json:"hold_ttl,omitempty"`
	ClosedAt  string `json:"closed_at,omitempty"`
	// Archived: the sale's orders are leaving (or have left, ArchiveDone)
	// the ledger; ArchivedOrders have so far.
	Archived       bool  `json:"archived,omitempty"`
	ArchivedOrders int64 `json:"archived_orders,omitempty"`
	ArchiveDone    bool  `json:"archive_done,omitempty"`
	// Mode is "lottery" for a lottery sale, described by Lottery.
	Mode    string       `json:"mode,omitempty"`
	Lottery *lotteryJSON `json:"lottery,omitempty"`
	// Admission is "queue" for a sale behind a waiting room, described by
	// Queue.
	Admission string         `json:"admission,omitempty"`
	Queue     *saleQueueJSON `json:"queue,omitempty"`
	// Stale: this node cannot reach a leader now; the figures are its last
	// applied state.
	Stale bool `json:"stale,omitempty"`
	// AppliedIndex: the figures hold every log entry up to this one.
	AppliedIndex uint64 `json:"applied_index"`
}

func skuJSON(v engine.SKUView) skuResponse {
	r := v.Row
	out := skuResponse{
		SKU: r.SKU, Total: r.Total, Remaining: r.Remaining(), Available: r.Available, Leased: r.LeasedTotal(),
		Held: r.Held, Sold: r.Sold, State: v.State, PerUser: r.Config.PerUser,
	}
	if r.Config.StartAtUnixNano != 0 {
		at := time.Unix(0, r.Config.StartAtUnixNano)
		out.StartAt = at.UTC().Format(time.RFC3339Nano)
		if v.State == engine.StateUpcoming {
			out.StartsIn = max(time.Until(at).Milliseconds(), 1)
		}
	}
	if r.Config.HoldTTLNanos != 0 {
		out.HoldTTL = time.Duration(r.Config.HoldTTLNanos).String()
	}
	if r.Closed() {
		out.ClosedAt = time.Unix(0, r.ClosedAtUnixNano).UTC().Format(time.RFC3339Nano)
	}
	out.Archived, out.ArchivedOrders, out.ArchiveDone = r.Archived, r.ArchivedOrders, r.PurgeDone
	out.AppliedIndex = v.Applied
	out.Mode, out.Lottery = r.Config.Mode, lotteryView(&r)
	out.Admission, out.Queue = r.Config.Admission, saleQueueView(&r)
	return out
}

// handleSaleCommand runs close or archive on a sale and answers its row.
func (s *Server) handleSaleCommand(ctx *fasthttp.RequestCtx, sku []byte, run func(string) error) {
	if !validID(sku) {
		writeRaw(ctx, fasthttp.StatusBadRequest, bodyBadSKU)
		return
	}
	if err := run(string(sku)); err != nil {
		writeEngineError(ctx, err)
		return
	}
	v, _ := s.engine.SKU(string(sku))
	writeJSON(ctx, fasthttp.StatusOK, skuJSON(v))
}

// orderResponse is GET /v1/orders/{id}.
type orderResponse struct {
	OrderID   string `json:"order_id"`
	SKU       string `json:"sku"`
	User      string `json:"user"`
	Qty       int64  `json:"qty"`
	State     string `json:"state"`
	RequestID string `json:"request_id,omitempty"`
	CreatedAt string `json:"created_at,omitempty"`
	ExpiresAt string `json:"expires_at,omitempty"`
	Released  string `json:"release_reason,omitempty"`
	// AppliedIndex: the answer holds every log entry up to this one (0 on
	// a write's answer).
	AppliedIndex uint64 `json:"applied_index,omitempty"`
}

func orderJSON(o stock.Order) orderResponse {
	out := orderResponse{OrderID: o.ID, SKU: o.SKU, User: o.User, Qty: o.Qty, State: string(o.State),
		RequestID: o.RequestID, Released: o.ReleaseReason}
	if o.CreatedAtUnixNano != 0 {
		out.CreatedAt = time.Unix(0, o.CreatedAtUnixNano).UTC().Format(time.RFC3339Nano)
	}
	if o.ExpiresAtUnixNano != 0 {
		out.ExpiresAt = time.Unix(0, o.ExpiresAtUnixNano).UTC().Format(time.RFC3339Nano)
	}
	return out
}

// decodeBody parses a small JSON body strictly: unknown fields are errors,
// so a typo in a sale config is not silently ignored.
func decodeBody(ctx *fasthttp.RequestCtx, v any) bool {
	dec := json.NewDecoder(bytesReader(ctx.PostBody()))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		writeError(ctx, fasthttp.StatusBadRequest, "bad_request", "malformed JSON body: "+err.Error())
		return false
	}
	if dec.More() {
		writeError(ctx, fasthttp.StatusBadRequest, "bad_request", "body holds more than one JSON value")
		return false
	}
	return true
}

// writeEngineError maps control-plane errors onto the contract's codes.
func writeEngineError(ctx *fasthttp.RequestCtx, err error) {
	f := func(code int, errCode string) { writeError(ctx, code, errCode, err.Error()) }
	switch {
	case errors.Is(err, engine.ErrUnknownSKU):
		f(fasthttp.StatusNotFound, "unknown_sku")
	case errors.Is(err, engine.ErrNotFound):
		f(fasthttp.StatusNotFound, "not_found")
	case errors.Is(err, engine.ErrForbidden):
		f(fasthttp.StatusForbidden, "forbidden")
	case errors.Is(err, engine.ErrConflict), errors.Is(err, engine.ErrTooManySKUs):
		f(fasthttp.StatusConflict, "conflict")
	case errors.Is(err, engine.ErrExpired):
		f(fasthttp.StatusConflict, "expired")
	case errors.Is(err, engine.ErrInvalidState):
		f(fasthttp.StatusConflict, "invalid_state")
	case errors.Is(err, engine.ErrInvalid), errors.Is(err, engine.ErrBadCursor):
		f(fasthttp.StatusBadRequest, "bad_request")
	case errors.Is(err, engine.ErrCursorExpired):
		f(fasthttp.StatusGone, "cursor_expired")
	case errors.Is(err, engine.ErrSaleClosed):
		f(fasthttp.StatusConflict, "closed")
	case errors.Is(err, engine.ErrNotClosed):
		f(fasthttp.StatusConflict, "not_closed")
	case errors.Is(err, engine.ErrHoldsPending):
		f(fasthttp.StatusConflict, "holds_pending")
	case errors.Is(err, engine.ErrUnconsumed):
		f(fasthttp.StatusConflict, "unconsumed_events")
	case errors.Is(err, control.ErrEntriesClosed):
		f(fasthttp.StatusConflict, "entries_closed")
	case errors.Is(err, engine.ErrOutcomeUnknown):
		f(fasthttp.StatusGatewayTimeout, "outcome_unknown")
	default:
		f(fasthttp.StatusServiceUnavailable, "unavailable")
	}
}

func (s *Server) handleCreateSale(ctx *fasthttp.RequestCtx, sku []byte) {
	if !validID(sku) {
		writeRaw(ctx, fasthttp.StatusBadRequest, bodyBadSKU)
		return
	}
	var req saleRequest
	if !decodeBody(ctx, &req) {
		return
	}
	spec := control.SaleSpec{PerUser: req.PerUser}
	switch {
	case req.Total == nil:
		writeError(ctx, fasthttp.StatusBadRequest, "bad_request", "total is required")
		return
	case *req.Total < 0 || *req.Total > maxSaleUnits:
		writeError(ctx, fasthttp.StatusBadRequest, "bad_request", fmt.Sprintf("total must be from 0 to %d", int64(maxSaleUnits)))
		return
	case req.PerUser < 0:
		writeError(ctx, fasthttp.StatusBadRequest, "bad_request", "per_user must be >= 0 (0: no limit)")
		return
	}
	spec.Total = *req.Total
	if req.StartAt != "" {
		at, ok := parseStoredTime(ctx, "start_at", req.StartAt)
		if !ok {
			return
		}
		spec.StartAt = at
	}
	switch req.Mode {
	case "":
		if req.EntriesCloseAt != "" {
			writeError(ctx, fasthttp.StatusBadRequest, "bad_request", `entries_close_at is for "mode":"lottery"`)
			return
		}
	case "lottery":
		if req.EntriesCloseAt == "" {
			writeError(ctx, fasthttp.StatusBadRequest, "bad_request", "a lottery needs entries_close_at, RFC 3339, like 2026-11-30T12:00:00Z")
			return
		}
		at, ok := parseStoredTime(ctx, "entries_close_at", req.EntriesCloseAt)
		if !ok {
			return
		}
		spec.Lottery, spec.EntriesCloseAt = true, at
	default:
		writeError(ctx, fasthttp.StatusBadRequest, "bad_request", `mode must be "lottery" or absent`)
		return
	}
	if !queueSpec(ctx, &req, &spec) {
		return
	}
	if req.HoldTTL != "" {
		ttl, err := time.ParseDuration(req.HoldTTL)
		if err != nil || ttl < 0 || ttl > MaxHoldTTL {
			writeError(ctx, fasthttp.StatusBadRequest, "bad_request", "hold_ttl must be a duration from 0s to "+MaxHoldTTL.String()+", like 90s or 15m")
			return
		}
		spec.HoldTTL = ttl
	}
	created, err := s.engine.CreateSale(string(sku), spec)
	if err != nil {
		writeEngineError(ctx, err)
		return
	}
	v, ok := s.engine.SKU(string(sku))
	if !ok {
		writeError(ctx, fasthttp.StatusServiceUnavailable, "unavailable", "sale created but not yet readable")
		return
	}
	code := fasthttp.StatusOK
	if created {
		code = fasthttp.StatusCreated
	}
	writeJSON(ctx, code, skuJSON(v))
}

// MaxHoldTTL bounds hold_ttl: a hold awaits a payment, not a season, and
// its deadline (the take's time plus the TTL) must stay a stored time.
const MaxHoldTTL = 30 * 24 * time.Hour

// parseStoredTime reads field, an RFC 3339 time the ledger must store
// exactly; on a bad one it answers 400 naming the field and reports false.
func parseStoredTime(ctx *fasthttp.RequestCtx, field, v string) (time.Time, bool) {
	at, err := time.Parse(time.RFC3339Nano, v)
	switch {
	case err != nil:
		writeError(ctx, fasthttp.StatusBadRequest, "bad_request", field+" must be RFC 3339, like 2026-11-30T12:00:00Z")
		return time.Time{}, false
	case fractionDigits(v) > 9:
		// time.Parse drops what lies past the nanosecond without a word.
		writeError(ctx, fasthttp.StatusBadRequest, "bad_request", field+" "+v+" is more precise than the ledger stores: at most 9 fractional digits (nanoseconds)")
		return time.Time{}, false
	case at.Before(control.StoredTimeMin) || at.After(control.StoredTimeMax):
		writeError(ctx, fasthttp.StatusBadRequest, "bad_request", fmt.Sprintf("%s %s is outside the times the ledger stores exactly (%s to %s)",
			field, v, control.StoredTimeMin.Format(time.RFC3339Nano), control.StoredTimeMax.Format(time.RFC3339Nano)))
		return time.Time{}, false
	}
	return at, true
}

// fractionDigits counts the digits of an RFC 3339 time's fraction of a
// second.
func fractionDigits(v string) int {
	i := strings.IndexByte(v, '.')
	if i < 0 {
		return 0
	}
	n := 0
	for i++; i < len(v) && v[i] >= '0' && v[i] <= '9'; i++ {
		n++
	}
	return n
}

func (s *Server) handleRestock(ctx *fasthttp.RequestCtx, sku []byte) {
	if !validID(sku) {
		writeRaw(ctx, fasthttp.StatusBadRequest, bodyBadSKU)
		return
	}
	var req struct {
		Qty int64 `json:"qty"`
	}
	if !decodeBody(ctx, &req) {
		return
	}
	if req.Qty < 1 || req.Qty > maxSaleUnits {
		writeError(ctx, fasthttp.StatusBadRequest, "bad_request", fmt.Sprintf("qty must be from 1 to %d", int64(maxSaleUnits)))
		return
	}
	if err := s.engine.Restock(string(sku), req.Qty); err != nil {
		writeEngineError(ctx, err)
		return
	}
	v, _ := s.engine.SKU(string(sku))
	writeJSON(ctx, fasthttp.StatusOK, skuJSON(v))
}

func (s *Server) handleGetSKU(ctx *fasthttp.RequestCtx, sku []byte) {
	// Cut off from the leader, a node still shows a sale's figures,
	// marked stale, though they may lack a take it answered.
	stale, ok := s.gate(ctx, true)
	if !ok {
		return
	}
	v, ok, answered := s.saleOrCatchUp(ctx, sku)
	if answered {
		return
	}
	if !ok {
		writeRaw(ctx, fasthttp.StatusNotFound, bodyUnknownSKU)
		return
	}
	if v.State == engine.StateSoldOut {
		// Units may have come back on another node: sold out is said
		// only when the node can vouch for it (as a deduct's sold_out).
		caughtUp, err := s.engine.Vouch()
		if err != nil {
			writeError(ctx, fasthttp.StatusServiceUnavailable, "unavailable", "cannot confirm that this sale is sold out: "+err.Error())
			return
		}
		if caughtUp {
			v, _ = s.engine.SKU(string(sku))
		}
	}
	// Remaining stock changes every instant of a sale; a second of caching
	// lets a CDN absorb the refresh storm.
	ctx.Response.Header.Set("Cache-Control", "public, max-age=1")
	out := skuJSON(v)
	out.Stale = stale || !s.engine.LeaderReachable()
	writeJSON(ctx, fasthttp.StatusOK, out)
}

func (s *Server) handleAudit(ctx *fasthttp.RequestCtx, sku []byte) {
	if !s.readGate(ctx) {
		return
	}
	a, local, ok, err := s.engine.Audit(string(sku))
	if err == nil && !ok {
		if !s.caughtUp(ctx) {
			return
		}
		a, local, ok, err = s.engine.Audit(string(sku))
	}
	if err != nil {
		writeEngineError(ctx, err)
		return
	}
	if !ok {
		writeRaw(ctx, fasthttp.StatusNotFound, bodyUnknownSKU)
		return
	}
	leased := map[string]int64{}
	for n, v := range a.Row.Leased {
		leased[n] = v
	}
	writeJSON(ctx, fasthttp.StatusOK, map[string]any{
		"ok": a.OK, "problem": a.Problem, "sku": a.Row.SKU, "total": a.Row.Total, "available": a.Row.Available,
		"leased": leased, "held": a.Row.Held, "sold": a.Row.Sold, "orders": a.Orders,
		"orders_held_units": a.OrdersHeld, "orders_sold_units": a.OrdersSold, "applied_index": a.AppliedIndex,
		"local": local,
	})
}

func (s *Server) handleGetOrder(ctx *fasthttp.RequestCtx, id []byte) {
	if !validID(id) {
		writeError(ctx, fasthttp.StatusBadRequest, "bad_request", "order id must be 1 to 128 letters, digits or . _ - :")
		return
	}
	if !s.readGate(ctx) {
		return
	}
	applied := s.engine.AppliedIndex()
	o, ok, err := s.engine.Order(string(id))
	if err == nil && !ok {
		if !s.caughtUp(ctx) {
			return
		}
		applied = s.engine.AppliedIndex()
		o, ok, err = s.engine.Order(string(id))
	}
	if err != nil {
		writeEngineError(ctx, err)
		return
	}
	if !ok {
		// A wait=none order still pending, or turned down, is known only
		// to the node that accepted it: ask that node, once.
		if s.relayOrderRead(ctx, string(id)) {
			return
		}
		writeError(ctx, fasthttp.StatusNotFound, "not_found", "no order with this id")
		return
	}
	out := orderJSON(o)
	out.AppliedIndex = applied
	writeJSON(ctx, fasthttp.StatusOK, out)
}

// relayOrderRead asks the node that minted order id (its id prefix) for
// it, unless that is this node or the call was itself relayed. It reports
// whether it wrote the answer.
func (s *Server) relayOrderRead(ctx *fasthttp.RequestCtx, id string) bool {
	if s.cluster == nil || s.peers.FromPeer(ctx) {
		return false
	}
	minter := s.engine.OrderOwner(id)
	if minter == "" || minter == s.cluster.Status().NodeID {
		return false
	}
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI("/v1/orders/" + id)
	req.Header.SetBytesV(fasthttp.HeaderAuthorization, ctx.Request.Header.Peek(fasthttp.HeaderAuthorization))
	if err := s.peers.Do(minter, req, resp, peerStatusTimeout*3); err != nil || resp.StatusCode() != fasthttp.StatusOK {
		return false
	}
	ctx.SetStatusCode(fasthttp.StatusOK)
	ctx.SetContentType(contentTypeJSON)
	ctx.SetBody(resp.Body())
	return true
}

func (s *Server) handleOrderCommand(ctx *fasthttp.RequestCtx, id []byte, run func(string) (stock.Order, error)) {
	if !validID(id) {
		writeError(ctx, fasthttp.StatusBadRequest, "bad_request", "order id must be 1 to 128 letters, digits or . _ - :")
		return
	}
	o, err := run(string(id))
	if err != nil {
		writeEngineError(ctx, err)
		return
	}
	writeJSON(ctx, fasthttp.StatusOK, orderJSON(o))
}

// readyCatchUpWait bounds how long /readyz waits for this node to apply
// what the leader has committed.
const readyCatchUpWait = time.Second

// handleReady is 200 once the node has a leader, can commit, and has
// applied everything the leader had committed when the probe arrived. A
// follower asks the leader for its commit index: its own is only learned
// from replication, so after a restart it can look caught up while it is
// not.
func (s *Server) handleReady(ctx *fasthttp.RequestCtx) {
	if s.cluster == nil {
		writeJSON(ctx, fasthttp.StatusOK, map[string]any{"ready": true})
		return
	}
	notReady := func(reason string) {
		writeJSON(ctx, fasthttp.StatusServiceUnavailable, map[string]any{"ready": false, "reason": reason})
	}
	st := s.cluster.Status()
	if st.Leader == "" {
		notReady("no raft leader")
		return
	}
	if s.engine.CommitBlocked() {
		notReady("commit breaker open: the ledger cannot commit now")
		return
	}
	target := st.CommitIndex
	if st.Leader != st.NodeID {
		var leader ClusterStatus
		if s.peers.Status(st.Leader, peerStatusTimeout, &leader) != nil {
			notReady("leader " + st.Leader + " not reachable over http")
			return
		}
		target = leader.CommitIndex
	}
	deadline := time.Now().Add(readyCatchUpWait)
	for st.AppliedIndex < target {
		if time.Now().After(deadline) {
			notReady(fmt.Sprintf("applied index %d behind the leader's commit index %d", st.AppliedIndex, target))
			return
		}
		time.Sleep(10 * time.Millisecond)
		st = s.cluster.Status()
	}
	if rules, known := s.rulesBar(); rules < known {
		notReady(fmt.Sprintf("the ledger runs rules %d while every voter knows rules %d: the leader switches them in a moment", rules, known))
		return
	}
	writeJSON(ctx, fasthttp.StatusOK, map[string]any{"ready": true, "leader": st.Leader, "applied_index": st.AppliedIndex})
}

// rulesBar returns the rules this node's ledger runs and the newest every
// voter knows (each asked, as for /v1/cluster). A new cluster is not ready
// until its ledger runs them, so its first answers follow them.
//
// A voter that registered its address and does not answer may be an older
// binary on its way to an upgrade: it lowers the bar to the first rules,
// so that a cluster in a rolling upgrade keeps serving with a node down
// (under whichever rules its ledger runs; none hands one user's order to
// another). A voter that has not registered yet (a new cluster's first
// second) has no say: the ledger's rules must reach this binary's first,
// which the leader switches as soon as every voter answers.
func (s *Server) rulesBar() (rules, known uint64) {
	cs := s.clusterStatus()
	if cs.LedgerRules >= cs.RulesKnown {
		return cs.LedgerRules, cs.RulesKnown
	}
	known = cs.RulesKnown
	for _, n := range cs.Nodes {
		switch {
		case n.Reachable:
			known = min(known, n.RulesKnown)
		case n.HTTPAddr != "":
			return cs.LedgerRules, 0
		}
	}
	return cs.LedgerRules, known
}
