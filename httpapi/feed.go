package httpapi

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"stockd.dev/stockd/engine/control"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"stockd.dev/stockd/engine"
	"stockd.dev/stockd/httpapi/deductwire"
	"stockd.dev/stockd/stock"
)

// The order feed's routes (docs/feed-and-lottery.md): GET /v1/events,
// GET /v1/consumers, PUT and DELETE /v1/consumers/{name}.

// eventJSON is one event of GET /v1/events.
type eventJSON struct {
	Cursor    string `json:"cursor"`
	Type      string `json:"type"`
	OrderID   string `json:"order_id"`
	SKU       string `json:"sku"`
	User      string `json:"user"`
	Qty       int64  `json:"qty"`
	State     string `json:"state"`
	RequestID string `json:"request_id,omitempty"`
	Reason    string `json:"reason,omitempty"`
	Node      string `json:"node,omitempty"`
	At        string `json:"at"`
	ExpiresAt string `json:"expires_at,omitempty"`
}

// eventsResponse is GET /v1/events: Next is the cursor to read after next
// time (the last event's, or the one given when there were none).
type eventsResponse struct {
	Events []eventJSON `json:"events"`
	Next   string      `json:"next"`
	Head   string      `json:"head"`
	// NodeBehind: the cursor lies beyond this node's log; it is catching up.
	NodeBehind bool `json:"node_behind,omitempty"`
}

func stamp(unixNano int64) string {
	if unixNano == 0 {
		return ""
	}
	return time.Unix(0, unixNano).UTC().Format(time.RFC3339Nano)
}

// feedDefaultLimit is a read's page size when the caller gives none.
const feedDefaultLimit = 100

func (s *Server) handleEvents(ctx *fasthttp.RequestCtx) {
	args := ctx.QueryArgs()
	after, err := engine.ParseCursor(string(args.Peek("after")))
	if err != nil {
		writeError(ctx, fasthttp.StatusBadRequest, "bad_request", err.Error())
		return
	}
	limit := feedDefaultLimit
	if v := args.Peek("limit"); len(v) > 0 {
		n, err := strconv.Atoi(string(v))
		if err != nil || n < 1 || n > control.FeedLimitMax {
			writeError(ctx, fasthttp.StatusBadRequest, "bad_request", fmt.Sprintf("limit must be from 1 to %d", control.FeedLimitMax))
			return
		}
		limit = n
	}
	var wait time.Duration
	if v := args.Peek("wait"); len(v) > 0 {
		wait, err = time.ParseDuration(string(v))
		if err != nil || wait < 0 || wait > control.FeedWaitMax {
			writeError(ctx, fasthttp.StatusBadRequest, "bad_request", fmt.Sprintf("wait must be a duration from 0 to %s", control.FeedWaitMax))
			return
		}
	}
	if !s.readGate(ctx) {
		return
	}
	// Not the RequestCtx as the context: a timer derived from it may fire
	// after the handler returned and fasthttp reused it (a data race). The
	// wait is bounded, and the engine's stop ends it too.
	page, err := s.engine.Events(context.Background(), after, limit, wait)
	if err != nil {
		writeEngineError(ctx, err)
		return
	}
	ctx.SetStatusCode(fasthttp.StatusOK)
	ctx.SetContentType(contentTypeJSON)
	ctx.SetBody(appendEvents(make([]byte, 0, 64+len(page.Events)*256), after, &page))
}

// appendEvents appends the eventsResponse of page, encoded by hand: a
// consumer that keeps up reads every event through here, and reflection
// would cost more than reading it.
func appendEvents(b []byte, after stock.Cursor, page *stock.FeedPage) []byte {
	next := after
	b = append(b, `{"events":[`...)
	for i := range page.Events {
		e := &page.Events[i]
		o := &e.Order
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"cursor":`...)
		b = appendJSONString(b, e.Cursor().String())
		b = append(b, `,"type":`...)
		b = appendJSONString(b, e.Type.String())
		b = append(b, `,"order_id":`...)
		b = appendJSONString(b, o.ID)
		b = append(b, `,"sku":`...)
		b = appendJSONString(b, o.SKU)
		b = append(b, `,"user":`...)
		b = appendJSONString(b, o.User)
		b = append(b, `,"qty":`...)
		b = appendInt(b, o.Qty)
		b = append(b, `,"state":`...)
		b = appendJSONString(b, string(o.State))
		if o.RequestID != "" {
			b = append(b, `,"request_id":`...)
			b = appendJSONString(b, o.RequestID)
		}
		if o.ReleaseReason != "" {
			b = append(b, `,"reason":`...)
			b = appendJSONString(b, o.ReleaseReason)
		}
		if o.Node != "" {
			b = append(b, `,"node":`...)
			b = appendJSONString(b, o.Node)
		}
		b = append(b, `,"at":`...)
		b = appendJSONString(b, stamp(e.At))
		if o.ExpiresAtUnixNano != 0 {
			b = append(b, `,"expires_at":`...)
			b = appendJSONString(b, stamp(o.ExpiresAtUnixNano))
		}
		b = append(b, '}')
		next = e.Cursor()
	}
	b = append(b, `],"next":`...)
	b = appendJSONString(b, next.String())
	b = append(b, `,"head":`...)
	b = appendJSONString(b, page.Head.String())
	if page.Behind {
		b = append(b, `,"node_behind":true`...)
	}
	return append(b, "}\n"...)
}

// consumerJSON is one consumer of GET /v1/consumers.
type consumerJSON struct {
	Name       string  `json:"name"`
	Cursor     string  `json:"cursor"`
	AckedAt    string  `json:"acked_at"`
	LagEvents  uint64  `json:"lag_events"`
	LagSeconds float64 `json:"lag_seconds"`
}

// consumersJSON is the consumers as the routes show them.
func consumersJSON(cs []control.ConsumerView) []consumerJSON {
	out := make([]consumerJSON, 0, len(cs))
	for _, c := range cs {
		out = append(out, consumerJSON{Name: c.Name, Cursor: c.Cursor.String(),
			AckedAt: c.AckedAt.UTC().Format(time.RFC3339Nano), LagEvents: c.LagEvents, LagSeconds: c.LagSeconds})
	}
	return out
}

// consumersResponse is GET /v1/consumers: the feed's state on this node
// and every consumer's position.
type consumersResponse struct {
	Head             string         `json:"head"`
	HeadAt           string         `json:"head_at,omitempty"`
	Floor            string         `json:"floor"`
	RetainedEvents   uint64         `json:"retained_events"`
	CapEvents        uint64         `json:"cap_events"`
	RetentionSeconds float64        `json:"retention_seconds"`
	Consumers        []consumerJSON `json:"consumers"`
}

func (s *Server) handleConsumers(ctx *fasthttp.RequestCtx) {
	v, err := s.engine.Feed()
	if err != nil {
		writeEngineError(ctx, err)
		return
	}
	out := consumersResponse{Head: v.Head.String(), Floor: v.Floor.String(), RetainedEvents: v.Retained,
		CapEvents: v.Cap, RetentionSeconds: v.Retention.Seconds(), Consumers: consumersJSON(v.Consumers)}
	if !v.HeadAt.IsZero() {
		out.HeadAt = v.HeadAt.UTC().Format(time.RFC3339Nano)
	}
	writeJSON(ctx, fasthttp.StatusOK, out)
}

// routeConsumer serves PUT and DELETE /v1/consumers/{name} (a follower
// relays them to the leader). The admin token creates, moves and drops a
// consumer; a service credential may only move a registered one forward
// (a sink acknowledging what it wrote).
func (s *Server) routeConsumer(ctx *fasthttp.RequestCtx, method, name []byte) {
	if string(method) != fasthttp.MethodPut && string(method) != fasthttp.MethodDelete {
		ctx.Response.Header.Set("Allow", "PUT, DELETE")
		writeError(ctx, fasthttp.StatusMethodNotAllowed, "method_not_allowed", "use PUT or DELETE")
		return
	}
	forwardOnly := string(method) == fasthttp.MethodPut && !s.isAdmin(ctx) && s.creds.Service(ctx.Request.Header.Peek(fasthttp.HeaderAuthorization))
	if !forwardOnly && !s.admin(ctx) || s.relayed(ctx) {
		return
	}
	if !validID(name) {
		writeError(ctx, fasthttp.StatusBadRequest, "bad_request", "a consumer name is 1 to 128 of a-z A-Z 0-9 . _ - :")
		return
	}
	if string(method) == fasthttp.MethodDelete {
		if err := s.engine.DropConsumer(string(name)); err != nil {
			writeEngineError(ctx, err)
			return
		}
		writeJSON(ctx, fasthttp.StatusOK, map[string]string{"name": string(name), "state": "dropped"})
		s.markApplied(ctx)
		return
	}
	var req struct {
		Cursor      *string `json:"cursor"`
		ForwardOnly bool    `json:"forward_only"`
	}
	if !decodeBody(ctx, &req) {
		return
	}
	if req.Cursor == nil {
		writeError(ctx, fasthttp.StatusBadRequest, "bad_request", `the body needs "cursor": the last event the consumer has handled ("0": none yet)`)
		return
	}
	c, err := engine.ParseCursor(*req.Cursor)
	if err != nil {
		writeError(ctx, fasthttp.StatusBadRequest, "bad_request", err.Error())
		return
	}
	if forwardOnly || req.ForwardOnly {
		moved, err := s.engine.AdvanceConsumer(string(name), c)
		if err != nil {
			writeEngineError(ctx, err)
			return
		}
		state := "acknowledged"
		if !moved {
			state = "already_past" // the consumer's cursor was at or after c
		}
		writeJSON(ctx, fasthttp.StatusOK, map[string]string{"name": string(name), "cursor": c.String(), "state": state})
		s.markApplied(ctx)
		return
	}
	if err := s.engine.AckConsumer(string(name), c); err != nil {
		writeEngineError(ctx, err)
		return
	}
	writeJSON(ctx, fasthttp.StatusOK, map[string]string{"name": string(name), "cursor": c.String(), "state": "acknowledged"})
	s.markApplied(ctx)
}

// ordersEnd is the last line of GET /v1/skus/{sku}/orders: a stream
// without it was cut short (resume with after=<the last order id read>).
type ordersEnd struct {
	Done   bool   `json:"done"`
	Orders int    `json:"orders"`
	Error  string `json:"error,omitempty"`
	// AppliedIndex and FeedCursor are the state the orders reflect: go on
	// reading the feed after FeedCursor.
	AppliedIndex uint64 `json:"applied_index"`
	FeedCursor   string `json:"feed_cursor"`
}

// handleSaleOrders streams a sale's orders as NDJSON, for reconciliation:
// one order per line (as GET /v1/orders/{id} shows it), in order id
// order, then one ordersEnd line.
func (s *Server) handleSaleOrders(ctx *fasthttp.RequestCtx, sku []byte) {
	if !validID(sku) {
		writeRaw(ctx, fasthttp.StatusBadRequest, bodyBadSKU)
		return
	}
	args := ctx.QueryArgs()
	state, after := string(args.Peek("state")), string(args.Peek("after"))
	switch state {
	case "", "held", "sold", "released":
	default:
		writeError(ctx, fasthttp.StatusBadRequest, "bad_request", "state must be held, sold or released")
		return
	}
	if after != "" && !validID([]byte(after)) {
		writeError(ctx, fasthttp.StatusBadRequest, "bad_request", "after must be an order id")
		return
	}
	_, ok, answered := s.saleCaughtUp(ctx, sku)
	if answered {
		return
	}
	if !ok {
		writeRaw(ctx, fasthttp.StatusNotFound, bodyUnknownSKU)
		return
	}
	name := string(sku)
	streamNDJSON(ctx, 256, func(emit func(any) error) any {
		end := ordersEnd{}
		snap, err := s.engine.SaleOrders(name, state, after, func(o *stock.Order) error {
			end.Orders++
			return emit(orderJSON(*o))
		})
		if errors.Is(err, control.ErrStreamStopped) {
			return nil
		}
		end.Done, end.AppliedIndex, end.FeedCursor = err == nil, snap.Applied, snap.FeedCursor.String()
		if err != nil {
			end.Error = err.Error()
		}
		return end
	})
}

// streamNDJSON answers 200 with NDJSON: run emits one line a value
// (flushed every flushEvery lines; emit fails with ErrStreamStopped once
// the client went away) and returns the last line, or nil to write none.
func streamNDJSON(ctx *fasthttp.RequestCtx, flushEvery int, run func(emit func(any) error) any) {
	ctx.SetStatusCode(fasthttp.StatusOK)
	ctx.SetContentType("application/x-ndjson")
	ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
		lines := 0
		line := func(v any) error {
			b, err := deductwire.MarshalLine(v) // ends with its newline
			if err != nil {
				return err
			}
			w.Write(b)
			return nil
		}
		end := run(func(v any) error {
			if err := line(v); err != nil {
				return err
			}
			if lines++; lines%flushEvery == 0 && w.Flush() != nil {
				return control.ErrStreamStopped // the client went away
			}
			return nil
		})
		if end != nil {
			_ = line(end)
		}
	})
}
