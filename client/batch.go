package client

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"
)

// BatchMaxItems is what one POST /v1/deducts carries; DeductBatch splits
// longer lists.
const BatchMaxItems = 1000

// Result is one deduct's outcome in a batch: Order (its RequestID always
// set) and, for a loss or no definite answer, Err as Deduct returns it.
type Result struct {
	Order Order
	Err   error
}

// DeductBatch runs ds as Deduct would, through POST /v1/deducts (split
// into requests of BatchMaxItems), and returns their results in order.
// Items whose answer is not definite (the whole request failed, or the
// item's own status is 503, 504 or 429) are sent again, with their request
// ids, until the context ends; the others keep their first answer.
func (c *Client) DeductBatch(ctx context.Context, ds []Deduct) []Result {
	out := make([]Result, len(ds))
	for i := range ds {
		d := &ds[i]
		if d.RequestID == "" {
			d.RequestID = newRequestID()
		}
		if d.Qty == 0 {
			d.Qty = 1
		}
		out[i].Order = Order{RequestID: d.RequestID, SKU: d.SKU, Qty: d.Qty}
	}
	for from := 0; from < len(ds); from += BatchMaxItems {
		to := min(from+BatchMaxItems, len(ds))
		c.deductBatch(ctx, ds[from:to], out[from:to])
	}
	return out
}

// batchItemAnswer is one item of POST /v1/deducts' answer.
type batchItemAnswer struct {
	Status    int    `json:"status"`
	Error     string `json:"error"`
	Detail    string `json:"detail"`
	OrderID   string `json:"order_id"`
	State     string `json:"state"`
	SKU       string `json:"sku"`
	Qty       int64  `json:"qty"`
	ExpiresAt string `json:"expires_at"`
}

func (c *Client) deductBatch(ctx context.Context, ds []Deduct, out []Result) {
	pending := make([]int, len(ds)) // items without a definite answer yet
	for i := range pending {
		pending[i] = i
	}
	noWait := ds[0].NoWait
	for len(pending) > 0 {
		items := make([]map[string]any, len(pending))
		for j, i := range pending {
			items[j] = map[string]any{"sku": ds[i].SKU, "user": ds[i].User, "qty": ds[i].Qty, "request_id": ds[i].RequestID}
			if ds[i].AdmissionToken != "" {
				items[j]["admission_token"] = ds[i].AdmissionToken
			}
		}
		body, err := json.Marshal(map[string]any{"deducts": items})
		if err != nil {
			for _, i := range pending {
				out[i].Err = err
			}
			return
		}
		path := "/v1/deducts"
		if noWait {
			path += "?wait=none"
		}
		status, answer, err := c.do(ctx, http.MethodPost, path, body, c.serviceToken(), fmt.Sprintf("%d items from %s", len(pending), ds[pending[0]].RequestID))
		if err == nil && status != http.StatusOK {
			err = refusal(status, answer, "")
		}
		var results struct {
			Results []batchItemAnswer `json:"results"`
		}
		if err == nil {
			if err = json.Unmarshal(answer, &results); err == nil && len(results.Results) != len(pending) {
				err = fmt.Errorf("stockd: %d results for %d items", len(results.Results), len(pending))
			}
		}
		if err != nil {
			for _, i := range pending {
				out[i].Err = itemError(err, ds[i].RequestID)
			}
			return
		}
		var again []int
		for j, i := range pending {
			r := results.Results[j]
			switch {
			case r.Status == http.StatusOK || r.Status == http.StatusAccepted:
				o := &out[i].Order
				o.OrderID, o.State, o.SKU, o.Qty = r.OrderID, r.State, r.SKU, r.Qty
				o.ExpiresAt = parseTime(r.ExpiresAt)
				out[i].Err = nil
			case !definite(r.Status):
				again = append(again, i)
				out[i].Err = &NotDefiniteError{RequestID: ds[i].RequestID, Last: fmt.Errorf("%d %s", r.Status, r.Error)}
			default:
				out[i].Err = &Error{Status: r.Status, Code: r.Error, Detail: r.Detail, RequestID: ds[i].RequestID}
			}
		}
		if len(again) > 0 && !c.pause(ctx, retryBackoffMin) {
			for _, i := range again {
				out[i].Err.(*NotDefiniteError).Cause = c.stopCause(ctx)
			}
			return
		}
		pending = again
	}
}

// itemError is a batch request's failure as one item's error.
func itemError(err error, requestID string) error {
	switch e := err.(type) {
	case *NotDefiniteError:
		return &NotDefiniteError{RequestID: requestID, Last: e.Last, Cause: e.Cause}
	case *Error:
		return &Error{Status: e.Status, Code: e.Code, Detail: e.Detail, RequestID: requestID}
	}
	return err
}

// stopCause is why a call stopped trying: the context's error, or
// ErrClientClosed.
func (c *Client) stopCause(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return ErrClientClosed
}

// parseTime reads an RFC 3339 time of an answer (zero if absent).
func parseTime(v string) time.Time {
	t, _ := time.Parse(time.RFC3339Nano, v)
	return t
}

// pause waits d unless the context ends or the client closes first
// (false).
func (c *Client) pause(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
	case <-c.closed:
	}
	return false
}
