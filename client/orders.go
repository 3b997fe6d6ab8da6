package client

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
)

// OrdersEnd is the last line of a sale's orders stream: the ledger state
// the orders reflect. The orders are the effects of the feed's events up
// to FeedCursor.
type OrdersEnd struct {
	Done         bool   `json:"done"`
	Orders       int    `json:"orders"`
	Error        string `json:"error"`
	AppliedIndex uint64 `json:"applied_index"`
	FeedCursor   string `json:"feed_cursor"`
}

// orderLineBytesMax bounds one line of the stream.
const orderLineBytesMax = 64 << 10

// SaleOrders streams sale sku's orders (GET /v1/skus/{sku}/orders), in
// order id order, calling each for every one with its JSON line. The
// orders come from one node's ledger at one moment: when the stream is
// cut short the read starts again on the next member from the beginning,
// after telling each with restart (each must then forget what it was
// given). It returns the stream's end line. Memory does not grow with
// the orders.
func (c *Client) SaleOrders(ctx context.Context, sku string, each func(line []byte) error, restart func()) (OrdersEnd, error) {
	path := "/v1/skus/" + url.PathEscape(sku) + "/orders"
	var last error
	backoff := retryBackoffMin
	for attempt := 0; ; attempt++ {
		if err := ctx.Err(); err != nil {
			return OrdersEnd{}, &NotDefiniteError{Last: last, Cause: err}
		}
		if attempt > 0 && restart != nil {
			restart()
		}
		m := c.pick()
		end, definiteErr, err := c.streamOrders(ctx, m, path, each)
		switch {
		case definiteErr != nil:
			return OrdersEnd{}, definiteErr
		case err == nil:
			return end, nil
		}
		last = fmt.Errorf("%s: %w", m.base, err)
		c.skip(m)
		if !c.pause(ctx, backoff) {
			return OrdersEnd{}, &NotDefiniteError{Last: last, Cause: c.stopCause(ctx)}
		}
		backoff = min(2*backoff, retryBackoffMax)
	}
}

// errStreamCut: the stream ended without its end line, or the node said
// it could not finish it.
var errStreamCut = errors.New("the orders stream ended early")

// streamOrders is one try of SaleOrders on member m: a definite refusal
// (404, 401), or err when another member should be tried.
func (c *Client) streamOrders(ctx context.Context, m *member, path string, each func([]byte) error) (end OrdersEnd, definiteErr, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, m.base+path, nil)
	if err != nil {
		return end, err, nil
	}
	if t := c.serviceToken(); t != "" {
		req.Header.Set("Authorization", "Bearer "+t)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return end, nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		answer, _ := io.ReadAll(io.LimitReader(resp.Body, answerBytesMax))
		if definite(resp.StatusCode) {
			return end, refusal(resp.StatusCode, answer, ""), nil
		}
		return end, nil, fmt.Errorf("%d %s", resp.StatusCode, bytes.TrimSpace(answer))
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 4096), orderLineBytesMax)
	for sc.Scan() {
		line := sc.Bytes()
		if bytes.HasPrefix(line, []byte(`{"done"`)) {
			if err := json.Unmarshal(line, &end); err != nil {
				return end, nil, fmt.Errorf("the end line %q: %w", line, err)
			}
			if !end.Done {
				return end, nil, fmt.Errorf("%w: %s", errStreamCut, end.Error)
			}
			return end, nil, nil
		}
		if err := each(line); err != nil {
			return end, err, nil
		}
	}
	if err := sc.Err(); err != nil {
		return end, nil, err
	}
	return end, nil, errStreamCut
}

// FeedHead is the order feed's newest event (its cursor; "0" when none),
// read after the node caught up with the leader: every event acknowledged
// before the call is at or before it.
func (c *Client) FeedHead(ctx context.Context) (string, error) {
	var p EventsPage
	err := c.call(ctx, http.MethodGet, "/v1/events?after=0&limit=1&wait=0s&consistency=linearizable", nil, c.serviceToken(), "", &p)
	if err == nil && p.Head == "" {
		return "", errors.New("stockd: the feed's answer has no head")
	}
	return p.Head, err
}

// SaleSummary is one sale as a node's statistics list it.
type SaleSummary struct {
	SKU      string `json:"sku"`
	State    string `json:"state"`
	Held     int64  `json:"held"`
	Sold     int64  `json:"sold"`
	Archived bool   `json:"archived"`
}

// Sales lists the sales one member knows (GET /v1/stats).
func (c *Client) Sales(ctx context.Context) ([]SaleSummary, error) {
	var st struct {
		SKUs []SaleSummary `json:"skus"`
	}
	err := c.call(ctx, http.MethodGet, "/v1/stats", nil, c.serviceToken(), "", &st)
	return st.SKUs, err
}
