package client

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// Ticket is a buyer's place in a queued sale's waiting room
// (docs/waiting-room.md).
type Ticket struct {
	// Ticket is the holder's secret: it reads the ticket and its token.
	Ticket   string `json:"ticket"`
	TicketID string `json:"ticket_id"`
	SKU      string `json:"sku"`
	User     string `json:"user"`
	// State is waiting, admitted, bought, expired or sold_out.
	State    string `json:"state"`
	Position int64  `json:"position"` // 0 before the open
	Ahead    int64  `json:"ahead"`
	ETAMs    int64  `json:"eta_ms"`
	// AdmissionToken is set while admitted, until AdmittedUntil: carry it
	// in Deduct.AdmissionToken.
	AdmissionToken string `json:"admission_token"`
	AdmittedUntil  string `json:"admitted_until"`
	Remaining      int64  `json:"remaining"`
	Held           int64  `json:"held"`
}

// Ticket states.
const (
	TicketWaiting  = "waiting"
	TicketAdmitted = "admitted"
	TicketBought   = "bought"
	TicketExpired  = "expired"
	TicketSoldOut  = "sold_out"
)

// Join gives user a place in queued sale sku: a new ticket, or the one
// they hold (joined on any node), so it is retried like a deduct.
// Refusals: ErrNotQueued, ErrSoldOut, ErrClosed, ErrUnknownSKU.
func (c *Client) Join(ctx context.Context, sku, user string) (Ticket, error) {
	var t Ticket
	err := c.call(ctx, http.MethodPost, "/v1/skus/"+url.PathEscape(sku)+"/queue", map[string]any{"user": user}, c.serviceToken(), "", &t)
	return t, err
}

// TicketWaitMax bounds a ticket's long-poll.
const TicketWaitMax = 60 * time.Second

// Ticket reads the ticket whose secret is ticket. With wait > 0 (at most
// TicketWaitMax) the node answers once its state or position changes, or
// after wait: a buyer's page follows its ticket with one call at a time.
func (c *Client) Ticket(ctx context.Context, ticket string, wait time.Duration) (Ticket, error) {
	wait = min(wait, TicketWaitMax)
	path := "/v1/queue/" + url.PathEscape(ticket)
	if wait > 0 {
		path += "?wait=" + strconv.FormatInt(wait.Milliseconds(), 10) + "ms"
		ctx = context.WithValue(ctx, longPollKey{}, wait)
	}
	var t Ticket
	err := c.call(ctx, http.MethodGet, path, nil, c.serviceToken(), "", &t)
	return t, err
}

// longPollKey marks a call's context with how long the node may hold
// it: each attempt's timeout grows by as much.
type longPollKey struct{}

func longPoll(ctx context.Context) time.Duration {
	d, _ := ctx.Value(longPollKey{}).(time.Duration)
	return d
}
