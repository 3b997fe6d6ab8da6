package httpapi

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/valyala/fasthttp"

	"stockd.dev/stockd/engine"
	"stockd.dev/stockd/engine/control"
	"stockd.dev/stockd/httpapi/deductwire"
	"stockd.dev/stockd/stock"
)

// The waiting room's routes (docs/waiting-room.md): joins, tickets with
// long-polls, the sale's queue and its tickets stream, key rotation.

var (
	pathV1Queue         = []byte("/v1/queue/")
	suffixQueue         = []byte("/queue")
	suffixQueueTickets  = []byte("/queue/tickets")
	suffixQueueRotate   = []byte("/queue/rotate")
	bodyJoinNoRequestID = deductwire.PrecomputedError("bad_request", "a join takes no request_id: a user's joins are one ticket, on any node")
	bodyJoinNoToken     = deductwire.PrecomputedError("bad_request", "a join takes no admission_token")
)

// ticketResponse is a ticket as its holder reads it.
type ticketResponse struct {
	Ticket         string `json:"ticket"`
	TicketID       string `json:"ticket_id"`
	SKU            string `json:"sku"`
	User           string `json:"user"`
	State          string `json:"state"`
	Position       int64  `json:"position"`
	Ahead          int64  `json:"ahead"`
	ETAMillis      int64  `json:"eta_ms"`
	AdmissionToken string `json:"admission_token"`
	AdmittedUntil  string `json:"admitted_until"`
	Remaining      int64  `json:"remaining"`
	Held           int64  `json:"held"`
}

// ticketJSON is ticket t of sale row as its holder sees it: the people
// ahead and an ETA once it opened (0: none), the token while admitted.
func (s *Server) ticketJSON(row *stock.SKU, t *stock.Ticket) ticketResponse {
	out := ticketResponse{Ticket: t.Secret, TicketID: hex.EncodeToString(t.ID[:]), SKU: t.SKU, User: t.User, State: t.State,
		Position: t.Position, Remaining: max(row.Remaining(), 0), Held: row.Held}
	if t.State == stock.TicketWaiting && t.Position > 0 {
		out.Ahead = max(t.Position-row.Queue.AdmittedThrough-1, 0)
		out.ETAMillis = s.engine.TicketETA(row, out.Ahead).Milliseconds()
	}
	if tok := control.TicketToken(row, t); tok != "" {
		out.AdmissionToken, out.AdmittedUntil = tok, stamp(t.AdmittedUntilUnixNano)
	}
	return out
}

// QueueEngine is the waiting room's part of Engine.
type QueueEngine interface {
	Join(ctx context.Context, sku, user string) (stock.SKU, stock.Ticket, error)
	Ticket(ctx context.Context, secret string, wait time.Duration) (stock.SKU, stock.Ticket, bool, error)
	Queue(sku string) (control.QueueView, bool, error)
	QueueTickets(sku string, fn func(*stock.Ticket) error) error
	RotateQueueKey(sku string) error
	AdmitRate(sku string) float64
	TicketETA(row *stock.SKU, ahead int64) time.Duration
	QueueCounters() control.QueueCounters
}

// routeQueueSKU serves /v1/skus/{sku}/queue[/tickets|/rotate], and
// reports whether rest was one of them.
func (s *Server) routeQueueSKU(ctx *fasthttp.RequestCtx, method, rest []byte) bool {
	switch {
	case bytes.HasSuffix(rest, suffixQueueTickets):
		if s.allow(ctx, method, fasthttp.MethodGet) && s.service(ctx) {
			s.handleQueueTickets(ctx, rest[:len(rest)-len(suffixQueueTickets)])
		}
	case bytes.HasSuffix(rest, suffixQueueRotate):
		if s.allow(ctx, method, fasthttp.MethodPost) && s.admin(ctx) && !s.relayed(ctx) {
			s.handleQueueRotate(ctx, rest[:len(rest)-len(suffixQueueRotate)])
			s.markApplied(ctx)
		}
	case bytes.HasSuffix(rest, suffixQueue):
		name := rest[:len(rest)-len(suffixQueue)]
		if string(method) == fasthttp.MethodPost {
			if s.service(ctx) {
				s.handleQueueJoin(ctx, name)
			}
		} else if s.allow(ctx, method, fasthttp.MethodGet) {
			s.handleQueueView(ctx, name)
		}
	default:
		return false
	}
	return true
}

// routeQueue serves GET /v1/queue/{ticket}.
func (s *Server) routeQueue(ctx *fasthttp.RequestCtx, method, secret []byte) {
	if !s.allow(ctx, method, fasthttp.MethodGet) || !s.service(ctx) {
		return
	}
	if len(secret) == 0 || len(secret) > 2*64 || !validID(secret) {
		writeError(ctx, fasthttp.StatusNotFound, "not_found", "no such ticket")
		return
	}
	var wait time.Duration
	if w := ctx.QueryArgs().Peek("wait"); w != nil {
		d, err := time.ParseDuration(string(w))
		if err != nil || d < 0 || d > control.TicketWaitMax {
			writeError(ctx, fasthttp.StatusBadRequest, "bad_request", "wait must be a duration from 0s to 60s, like 30s")
			return
		}
		wait = d
	}
	// The engine catches up with the cluster before it reads, and again
	// after a long-poll waited (the plane's Ticket says why): 503 when it
	// cannot.
	row, t, ok, err := s.engine.Ticket(context.Background(), string(secret), wait)
	switch {
	case err != nil:
		writeEngineError(ctx, err)
	case !ok:
		writeError(ctx, fasthttp.StatusNotFound, "not_found", "no such ticket")
	default:
		writeJSON(ctx, fasthttp.StatusOK, s.ticketJSON(&row, &t))
	}
}

// handleJoin serves POST /v1/skus/{sku}/queue.
func (s *Server) handleQueueJoin(ctx *fasthttp.RequestCtx, sku []byte) {
	if !validID(sku) {
		writeRaw(ctx, fasthttp.StatusBadRequest, bodyBadSKU)
		return
	}
	var read deductwire.Reader
	user, requestID, bad := read.ReadEntry(&ctx.Request)
	switch {
	case bad != nil:
		writeRaw(ctx, fasthttp.StatusBadRequest, bad)
		return
	case len(requestID) > 0:
		writeRaw(ctx, fasthttp.StatusBadRequest, bodyJoinNoRequestID)
		return
	case len(ctx.Request.Header.Peek(deductwire.HeaderAdmission)) > 0:
		writeRaw(ctx, fasthttp.StatusBadRequest, bodyJoinNoToken)
		return
	}
	row, t, err := s.engine.Join(context.Background(), string(sku), string(user))
	if err != nil {
		writeQueueError(ctx, err)
		return
	}
	writeJSON(ctx, fasthttp.StatusOK, s.ticketJSON(&row, &t))
}

// writeQueueError maps Join's errors onto the contract's codes.
func writeQueueError(ctx *fasthttp.RequestCtx, err error) {
	switch {
	case errors.Is(err, control.ErrNotQueued):
		writeError(ctx, fasthttp.StatusConflict, "not_queued", err.Error())
	case errors.Is(err, control.ErrSoldOut):
		writeError(ctx, fasthttp.StatusConflict, "sold_out", err.Error())
	case errors.Is(err, control.ErrBusy):
		ctx.Response.Header.Set("Retry-After", "1")
		writeError(ctx, fasthttp.StatusTooManyRequests, "rate_limited", err.Error())
	default:
		writeEngineError(ctx, err)
	}
}

// queueResponse is GET /v1/skus/{sku}/queue.
type queueResponse struct {
	SKU                 string `json:"sku"`
	Waiting             int64  `json:"waiting"`
	AdmittedOutstanding int64  `json:"admitted_outstanding"`
	AdmittedBound       int64  `json:"admitted_bound"`
	AdmittedTotal       int64  `json:"admitted_total"`
	Bought              int64  `json:"bought"`
	Expired             int64  `json:"expired"`
	SoldOutTold         int64  `json:"sold_out_told"`
	CutoffPosition      int64  `json:"cutoff_position"`
	AdmitPerSecond      string `json:"admit_per_second"`
	SeedCommitment      string `json:"seed_commitment"`
	Seed                string `json:"seed"`
	OpenedAt            string `json:"opened_at,omitempty"`
	// SoldOutToldAfter is how long after the entry that sold the last
	// unit this node woke every long-poll waiting on the sale.
	SoldOutToldAfter string `json:"sold_out_told_after,omitempty"`
	AppliedIndex     uint64 `json:"applied_index"`
}

// queueJSON is queued sale v as GET /v1/skus/{sku}/queue and the stats
// show it.
func (s *Server) queueJSON(v *control.QueueView, told map[string]float64) queueResponse {
	q := v.Row.Queue
	out := queueResponse{SKU: v.Row.SKU, Waiting: v.Waiting, AdmittedOutstanding: v.AdmittedOutstanding, AdmittedBound: v.Bound,
		AdmittedTotal: v.AdmittedTotal, Bought: v.Bought, Expired: v.Expired, SoldOutTold: v.SoldOutTold, CutoffPosition: v.CutoffPosition,
		AdmitPerSecond: strconv.FormatFloat(s.engine.AdmitRate(v.Row.SKU), 'f', 1, 64),
		SeedCommitment: hex.EncodeToString(q.SeedCommitment), OpenedAt: stamp(q.OpenedAtUnixNano)}
	if q.Opened() {
		out.Seed = hex.EncodeToString(q.Seed)
	}
	if secs, ok := told[v.Row.SKU]; ok && q.SoldOutAtUnixNano != 0 {
		out.SoldOutToldAfter = time.Duration(secs * float64(time.Second)).Round(time.Microsecond).String()
	}
	return out
}

// handleQueueView serves GET /v1/skus/{sku}/queue.
func (s *Server) handleQueueView(ctx *fasthttp.RequestCtx, sku []byte) {
	sv, ok := s.queuedSale(ctx, sku)
	if !ok {
		return
	}
	v, _, err := s.engine.Queue(string(sku))
	if err != nil {
		writeQueueError(ctx, err)
		return
	}
	out := s.queueJSON(&v, s.engine.QueueCounters().SoldOutTold)
	out.AppliedIndex = sv.Applied
	writeJSON(ctx, fasthttp.StatusOK, out)
}

// queuedSale reads sale sku for a queue read, caught up with the
// cluster before it finds none; false when it answered (400, 404, 503).
func (s *Server) queuedSale(ctx *fasthttp.RequestCtx, sku []byte) (engine.SKUView, bool) {
	if !validID(sku) {
		writeRaw(ctx, fasthttp.StatusBadRequest, bodyBadSKU)
		return engine.SKUView{}, false
	}
	v, ok, answered := s.saleCaughtUp(ctx, sku)
	if !ok && !answered {
		writeRaw(ctx, fasthttp.StatusNotFound, deductwire.BodyUnknownSKU)
	}
	return v, ok && !answered
}

// ticketLine is one line of GET /v1/skus/{sku}/queue/tickets.
type ticketLine struct {
	TicketID    string `json:"ticket_id"`
	User        string `json:"user"`
	JoinedIndex int64  `json:"joined_index"`
	Position    int64  `json:"position"`
}

// ticketsEnd closes the tickets stream.
type ticketsEnd struct {
	Done    bool   `json:"done"`
	Tickets int64  `json:"tickets"`
	Error   string `json:"error,omitempty"`
}

// handleQueueTickets serves GET /v1/skus/{sku}/queue/tickets: every
// ticket in line order once the sale opened, in join order before it.
func (s *Server) handleQueueTickets(ctx *fasthttp.RequestCtx, sku []byte) {
	v, ok := s.queuedSale(ctx, sku)
	if !ok {
		return
	}
	if v.Row.Queue == nil {
		writeError(ctx, fasthttp.StatusNotFound, "not_found", "no sale with a waiting room has this sku")
		return
	}
	name := string(sku)
	streamNDJSON(ctx, 1024, func(emit func(any) error) any {
		end := ticketsEnd{}
		err := s.engine.QueueTickets(name, func(t *stock.Ticket) error {
			end.Tickets++
			return emit(ticketLine{TicketID: hex.EncodeToString(t.ID[:]), User: t.User, JoinedIndex: t.JoinedIndex, Position: t.Position})
		})
		if errors.Is(err, control.ErrStreamStopped) {
			return nil
		}
		end.Done = err == nil
		if err != nil {
			end.Error = err.Error()
		}
		return end
	})
}

// handleQueueRotate serves POST /v1/skus/{sku}/queue/rotate (admin).
func (s *Server) handleQueueRotate(ctx *fasthttp.RequestCtx, sku []byte) {
	if !validID(sku) {
		writeRaw(ctx, fasthttp.StatusBadRequest, bodyBadSKU)
		return
	}
	if err := s.engine.RotateQueueKey(string(sku)); err != nil {
		writeQueueError(ctx, err)
		return
	}
	writeJSON(ctx, fasthttp.StatusOK, map[string]any{"sku": string(sku), "rotated": true})
}

// saleQueueJSON is a queued sale's waiting room in the sale's answer.
type saleQueueJSON struct {
	Overadmit      string `json:"queue_overadmit"`
	AdmitTTL       string `json:"queue_admit_ttl"`
	SeedCommitment string `json:"seed_commitment"`
	Seed           string `json:"seed"`
	Joined         int64  `json:"joined"`
	Admitted       int64  `json:"admitted_outstanding"`
}

func saleQueueView(r *stock.SKU) *saleQueueJSON {
	q := r.Queue
	if q == nil {
		return nil
	}
	milli, ttl := r.Config.QueueOveradmit(), r.Config.QueueAdmitTTL()
	out := &saleQueueJSON{Overadmit: strconv.FormatFloat(float64(milli)/1000, 'f', -1, 64), AdmitTTL: time.Duration(ttl).String(),
		SeedCommitment: hex.EncodeToString(q.SeedCommitment), Joined: q.Joined, Admitted: q.Outstanding}
	if q.SoldOutAtUnixNano != 0 {
		out.Admitted = 0 // the tickets admitted and unused read sold_out
	}
	if q.Opened() {
		out.Seed = hex.EncodeToString(q.Seed)
	}
	return out
}

// queueSpec reads a sale's waiting-room settings into spec; on a bad one
// it answers 400 naming it and reports false. queue_overadmit is a
// number with at most three decimals (stored in thousandths, exactly).
func queueSpec(ctx *fasthttp.RequestCtx, req *saleRequest, spec *control.SaleSpec) bool {
	bad := func(detail string) bool {
		writeError(ctx, fasthttp.StatusBadRequest, "bad_request", detail)
		return false
	}
	switch req.Admission {
	case "":
		if req.QueueOveradmit != nil || req.QueueAdmitTTL != "" {
			return bad(`queue_overadmit and queue_admit_ttl are for "admission":"queue"`)
		}
		return true
	case stock.AdmissionQueue:
	default:
		return bad(`admission must be "queue" or absent`)
	}
	if req.Mode != "" {
		return bad("a lottery takes no waiting room")
	}
	spec.Queue = true
	if req.QueueOveradmit != nil {
		milli, ok := thousandths(string(*req.QueueOveradmit))
		if !ok || milli < 1000 || milli > 100_000 {
			return bad("queue_overadmit must be a number from 1 to 100 with at most three decimals, like 1.2")
		}
		spec.OveradmitMilli = milli
	}
	if req.QueueAdmitTTL != "" {
		ttl, err := time.ParseDuration(req.QueueAdmitTTL)
		if err != nil || ttl < time.Second || ttl > MaxHoldTTL {
			return bad("queue_admit_ttl must be a duration from 1s to " + MaxHoldTTL.String() + ", like 5m")
		}
		spec.AdmitTTL = ttl
	}
	return true
}

// thousandths reads a JSON number written with at most three decimals
// (no exponent) as an exact count of thousandths.
func thousandths(n string) (int64, bool) {
	whole, frac, _ := strings.Cut(n, ".")
	if len(frac) > 3 || whole == "" || strings.ContainsAny(n, "eE+-") {
		return 0, false
	}
	w, err := strconv.ParseInt(whole, 10, 64)
	if err != nil || w > 1_000_000 {
		return 0, false
	}
	f := int64(0)
	if frac != "" {
		v, err := strconv.ParseInt(frac+strings.Repeat("0", 3-len(frac)), 10, 64)
		if err != nil {
			return 0, false
		}
		f = v
	}
	return w*1000 + f, true
}

// writeQueueMetrics writes the waiting rooms' metrics: per queued sale,
// tickets by state, the tokens out against their bound, the admit rate
// and how long after the last unit sold this node told every waiting
// ticket; the joins, admissions and refused tokens counted.
func (s *Server) writeQueueMetrics(w *bytes.Buffer, m *engine.Snapshot) {
	for _, v := range s.engine.SKUViews() {
		r := &v.Row
		if r.Queue == nil {
			continue
		}
		qv, _, err := s.engine.Queue(r.SKU)
		if err != nil {
			continue
		}
		for _, st := range []struct {
			state string
			n     int64
		}{{stock.TicketWaiting, qv.Waiting}, {stock.TicketAdmitted, qv.AdmittedOutstanding}, {stock.TicketBought, qv.Bought},
			{stock.TicketExpired, qv.Expired}, {stock.TicketSoldOut, qv.SoldOutTold}} {
			metrics.WriteGaugeUint64(w, fmt.Sprintf(`stockd_queue_tickets{sku=%q,state=%q}`, r.SKU, st.state), uint64(max(st.n, 0)))
		}
		metrics.WriteGaugeUint64(w, fmt.Sprintf(`stockd_queue_admitted_outstanding{sku=%q}`, r.SKU), uint64(max(qv.AdmittedOutstanding, 0)))
		metrics.WriteGaugeUint64(w, fmt.Sprintf(`stockd_queue_admitted_bound{sku=%q}`, r.SKU), uint64(max(qv.Bound, 0)))
		metrics.WriteGaugeFloat64(w, fmt.Sprintf(`stockd_queue_admit_per_second{sku=%q}`, r.SKU), s.engine.AdmitRate(r.SKU))
	}
	c := s.engine.QueueCounters()
	for sku, secs := range c.SoldOutTold {
		metrics.WriteGaugeFloat64(w, fmt.Sprintf(`stockd_queue_sold_out_told_seconds{sku=%q}`, sku), secs)
	}
	metrics.WriteCounterUint64(w, "stockd_queue_joins_total", c.Joins)
	metrics.WriteCounterUint64(w, "stockd_queue_admissions_total", c.Admitted)
	for i, reason := range engine.TokenRefusals {
		metrics.WriteCounterUint64(w, fmt.Sprintf(`stockd_queue_tokens_refused_total{reason=%q}`, reason), m.TokensRefused[i])
	}
}
