package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// OrderInfo is an order as GET /v1/orders/{id} reads it.
type OrderInfo struct {
	OrderID       string `json:"order_id"`
	SKU           string `json:"sku"`
	User          string `json:"user"`
	Qty           int64  `json:"qty"`
	State         string `json:"state"` // pending, held, sold, released
	RequestID     string `json:"request_id"`
	CreatedAt     string `json:"created_at"`
	ExpiresAt     string `json:"expires_at"`
	ReleaseReason string `json:"release_reason"`
}

// Sale is a sale's row as GET /v1/skus/{sku} reads it.
type Sale struct {
	SKU       string `json:"sku"`
	Total     int64  `json:"total"`
	Remaining int64  `json:"remaining"`
	Available int64  `json:"available"`
	Leased    int64  `json:"leased"`
	Held      int64  `json:"held"`
	Sold      int64  `json:"sold"`
	State     string `json:"state"` // upcoming, open, sold_out, closed
	StartAt   string `json:"start_at"`
	PerUser   int64  `json:"per_user"`
	HoldTTL   string `json:"hold_ttl"`
	Mode      string `json:"mode"`
	Stale     bool   `json:"stale"`
}

// SaleConfig is what CreateSale sets (zero values: none).
type SaleConfig struct {
	Total   int64
	StartAt time.Time
	PerUser int64
	HoldTTL time.Duration
	// Lottery sales take entries until EntriesCloseAt.
	Lottery        bool
	EntriesCloseAt time.Time
	// Queue puts the sale behind a waiting room: tokens out stay under
	// ceil(QueueOveradmit x remaining) (0: 1.2; at most three decimals),
	// each valid for QueueAdmitTTL (0: 5m).
	Queue          bool
	QueueOveradmit float64
	QueueAdmitTTL  time.Duration
}

// Entry is a lottery entrant's standing.
type Entry struct {
	EntryID    string `json:"entry_id"`
	SKU        string `json:"sku"`
	User       string `json:"user"`
	State      string `json:"state"` // entered, won, waitlisted, lost
	OrderID    string `json:"order_id"`
	OrderState string `json:"order_state"`
	Position   int64  `json:"position"`
	Rank       int64  `json:"rank"`
	EnteredAt  string `json:"entered_at"`
}

// call runs one call (retried as the package doc says while retryUnknown,
// else only after 503 and failed dials) and decodes a 2xx answer into out.
func (c *Client) call(ctx context.Context, method, path string, body any, token, requestID string, out any) error {
	var b []byte
	if body != nil {
		var err error
		if b, err = json.Marshal(body); err != nil {
			return err
		}
	}
	status, answer, err := c.do(ctx, method, path, b, token, requestID)
	if err != nil {
		return err
	}
	if status/100 != 2 {
		return refusal(status, answer, requestID)
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(answer, out); err != nil {
		return fmt.Errorf("stockd: %s %s answered %d with %q: %w", method, path, status, answer, err)
	}
	return nil
}

// Order reads one order on any member (a node asks the node that minted
// a pending order it does not know).
func (c *Client) Order(ctx context.Context, orderID string) (OrderInfo, error) {
	var o OrderInfo
	err := c.call(ctx, http.MethodGet, "/v1/orders/"+url.PathEscape(orderID), nil, c.serviceToken(), "", &o)
	return o, err
}

// Confirm turns a held order sold. It is idempotent: retried like a
// deduct, and a confirm of a sold order answers the order again.
func (c *Client) Confirm(ctx context.Context, orderID string) (OrderInfo, error) {
	var o OrderInfo
	err := c.call(ctx, http.MethodPost, "/v1/orders/"+url.PathEscape(orderID)+"/confirm", nil, c.serviceToken(), "", &o)
	return o, err
}

// Cancel releases a held order (idempotent, as Confirm).
func (c *Client) Cancel(ctx context.Context, orderID string) (OrderInfo, error) {
	var o OrderInfo
	err := c.call(ctx, http.MethodPost, "/v1/orders/"+url.PathEscape(orderID)+"/cancel", nil, c.serviceToken(), "", &o)
	return o, err
}

// SKU reads a sale.
func (c *Client) SKU(ctx context.Context, sku string) (Sale, error) {
	var s Sale
	err := c.call(ctx, http.MethodGet, "/v1/skus/"+url.PathEscape(sku), nil, "", "", &s)
	return s, err
}

// CreateSale creates a sale (admin). The same config again answers the
// sale (created false); another config is ErrConflict. Idempotent, so
// retried like a deduct.
func (c *Client) CreateSale(ctx context.Context, sku string, cfg SaleConfig) (Sale, error) {
	body := map[string]any{"total": cfg.Total}
	if !cfg.StartAt.IsZero() {
		body["start_at"] = cfg.StartAt.UTC().Format(time.RFC3339Nano)
	}
	if cfg.PerUser > 0 {
		body["per_user"] = cfg.PerUser
	}
	if cfg.HoldTTL > 0 {
		body["hold_ttl"] = cfg.HoldTTL.String()
	}
	if cfg.Lottery {
		body["mode"] = "lottery"
		body["entries_close_at"] = cfg.EntriesCloseAt.UTC().Format(time.RFC3339Nano)
	}
	if cfg.Queue {
		body["admission"] = "queue"
		if cfg.QueueOveradmit != 0 {
			body["queue_overadmit"] = cfg.QueueOveradmit
		}
		if cfg.QueueAdmitTTL != 0 {
			body["queue_admit_ttl"] = cfg.QueueAdmitTTL.String()
		}
	}
	var s Sale
	err := c.call(ctx, http.MethodPut, "/v1/skus/"+url.PathEscape(sku), body, c.cfg.AdminToken, "", &s)
	return s, err
}

// CloseSale stops a sale for good (admin; idempotent).
func (c *Client) CloseSale(ctx context.Context, sku string) (Sale, error) {
	var s Sale
	err := c.call(ctx, http.MethodPost, "/v1/skus/"+url.PathEscape(sku)+"/close", nil, c.cfg.AdminToken, "", &s)
	return s, err
}

// Enter enters user into lottery sku; a repeat of the user answers their
// first entry, so it is retried like a deduct. requestID may be empty.
func (c *Client) Enter(ctx context.Context, sku, user, requestID string) (Entry, error) {
	body := map[string]any{"user": user}
	if requestID != "" {
		body["request_id"] = requestID
	}
	var e Entry
	err := c.call(ctx, http.MethodPost, "/v1/skus/"+url.PathEscape(sku)+"/enter", body, c.serviceToken(), requestID, &e)
	return e, err
}

// Entry reads user's standing in lottery sku.
func (c *Client) Entry(ctx context.Context, sku, user string) (Entry, error) {
	var e Entry
	err := c.call(ctx, http.MethodGet, "/v1/skus/"+url.PathEscape(sku)+"/entries/"+url.PathEscape(user), nil, c.serviceToken(), "", &e)
	return e, err
}

// Restock adds qty units to a sale (admin). It is not idempotent: it is
// sent again only when it surely was not applied (503, 429, a failed
// dial); after a 504 or a connection lost once sent it ends in a
// NotDefiniteError whose cause is ErrMaybeApplied, and the caller reads
// the sale to learn whether the units came.
func (c *Client) Restock(ctx context.Context, sku string, qty int64) (Sale, error) {
	b, err := json.Marshal(map[string]any{"qty": qty})
	if err != nil {
		return Sale{}, err
	}
	status, answer, err := c.doAs(ctx, http.MethodPost, "/v1/skus/"+url.PathEscape(sku)+"/restock", b, c.cfg.AdminToken, "", false)
	if err != nil {
		return Sale{}, err
	}
	if status/100 != 2 {
		return Sale{}, refusal(status, answer, "")
	}
	var s Sale
	if err := json.Unmarshal(answer, &s); err != nil {
		return Sale{}, fmt.Errorf("stockd: restock answered %d with %q: %w", status, answer, err)
	}
	return s, nil
}

// ClusterStatus is GET /v1/cluster: this node's view and each member's.
type ClusterStatus struct {
	NodeID      string `json:"node_id"`
	State       string `json:"state"`
	Leader      string `json:"leader"`
	Term        uint64 `json:"term"`
	LedgerRules uint64 `json:"ledger_rules"`
	Nodes       []struct {
		ID        string `json:"id"`
		HTTPAddr  string `json:"http_addr"`
		Reachable bool   `json:"reachable"`
		State     string `json:"state"`
	} `json:"nodes"`
}

// Cluster reads the cluster as one member sees it.
func (c *Client) Cluster(ctx context.Context) (ClusterStatus, error) {
	var st ClusterStatus
	err := c.call(ctx, http.MethodGet, "/v1/cluster", nil, "", "", &st)
	return st, err
}

// EventsPage is one read of the order feed: the events after a cursor (as
// the JSON the node sent, one object each), the cursor to read after next
// time, and the feed's head.
type EventsPage struct {
	Events []json.RawMessage `json:"events"`
	Next   string            `json:"next"`
	Head   string            `json:"head"`
}

// ErrCursorExpired: the cursor is older than the feed's retention (410).
var ErrCursorExpired = errors.New("cursor expired")

// Events reads up to limit events of the order feed after cursor after
// ("0": from the oldest kept), waiting up to wait for the first new one.
// A node that does not answer is passed for the next, as for a deduct (a
// read changes nothing). Set Config.AttemptTimeout above wait.
func (c *Client) Events(ctx context.Context, after string, limit int, wait time.Duration) (EventsPage, error) {
	var p EventsPage
	body, err := c.EventsJSON(ctx, after, limit, wait)
	if err == nil {
		err = json.Unmarshal(body, &p)
	}
	return p, err
}

// EventsJSON is Events' page as the node sent it (an EventsPage in
// JSON), for a consumer that reads many events and parses them its own
// way.
func (c *Client) EventsJSON(ctx context.Context, after string, limit int, wait time.Duration) ([]byte, error) {
	q := url.Values{"after": {after}, "limit": {strconv.Itoa(limit)}, "wait": {wait.String()}}
	path := "/v1/events?" + q.Encode()
	status, answer, err := c.do(ctx, http.MethodGet, path, nil, c.serviceToken(), "")
	if err != nil {
		return nil, err
	}
	if status/100 != 2 {
		return nil, refusal(status, answer, "")
	}
	return answer, nil
}

// ConsumerCursor returns the cursor consumer name acknowledged last
// (found false: the cluster knows no such consumer).
func (c *Client) ConsumerCursor(ctx context.Context, name string) (cursor string, found bool, err error) {
	var st struct {
		Consumers []struct {
			Name   string `json:"name"`
			Cursor string `json:"cursor"`
		} `json:"consumers"`
	}
	if err := c.call(ctx, http.MethodGet, "/v1/consumers", nil, c.serviceToken(), "", &st); err != nil {
		return "", false, err
	}
	for _, k := range st.Consumers {
		if k.Name == name {
			return k.Cursor, true, nil
		}
	}
	return "", false, nil
}

// AckConsumer records cursor as consumer name's (admin; through any node,
// idempotent): the feed keeps the events after it. It registers the
// consumer, and may move it back.
func (c *Client) AckConsumer(ctx context.Context, name, cursor string) error {
	return c.call(ctx, http.MethodPut, "/v1/consumers/"+url.PathEscape(name), map[string]any{"cursor": cursor}, c.cfg.AdminToken, "", nil)
}

// AdvanceConsumer moves registered consumer name forward to cursor, and
// never back (moved false: its cursor was already at or past it). The
// service credential may do this; a cluster whose nodes do not all run a
// version that knows it answers 403.
func (c *Client) AdvanceConsumer(ctx context.Context, name, cursor string) (moved bool, err error) {
	var out struct {
		State string `json:"state"`
	}
	err = c.call(ctx, http.MethodPut, "/v1/consumers/"+url.PathEscape(name), map[string]any{"cursor": cursor, "forward_only": true}, c.serviceToken(), "", &out)
	return out.State == "acknowledged", err
}
