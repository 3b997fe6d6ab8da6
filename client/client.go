// Package client is how a Go service calls stockd over HTTP. It carries
// the rules that make stockd's guarantees hold end to end, so that no
// caller has to rediscover them:
//
//   - Every deduct carries a request id, made here when the caller leaves
//     it empty and returned in the Order, even with an error.
//   - An answer that is not definite (503, 504 outcome_unknown, a dropped
//     connection, a node that does not answer) is retried with the same
//     request id on the next node until the context ends; 429 is retried
//     after its Retry-After. A call thus ends in a definite outcome, or in
//     an error that names the request id to retry with.
//   - Definite answers (a win, sold_out, user_limit, request_id_reused,
//     400, 404, ...) are never retried.
//   - The cluster's members are found through GET /v1/cluster from any
//     endpoint given, and calls are spread over them; a node that fails a
//     call is skipped for a while.
//
// A Client is safe for concurrent use by any number of goroutines. It
// speaks the HTTP contract only: of stockd it imports no more than the leaf
// helper that reads certificate files (internal/certs).
package client

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Errors a call may end in; compare with errors.Is. A definite answer of
// stockd is an *Error that matches the sentinel of its code.
var (
	ErrSoldOut         = errors.New("sold out")
	ErrUserLimit       = errors.New("user limit")
	ErrNotStarted      = errors.New("sale not started")
	ErrClosed          = errors.New("sale closed")
	ErrRequestIDReused = errors.New("request id reused")
	ErrUnknownSKU      = errors.New("unknown sku")
	ErrLotterySale     = errors.New("lottery sale")
	ErrBadRequest      = errors.New("bad request")
	ErrNotFound        = errors.New("not found")
	ErrConflict        = errors.New("conflict")
	ErrExpired         = errors.New("hold expired")
	ErrInvalidState    = errors.New("invalid state")
	ErrEntriesClosed   = errors.New("entries closed")
	ErrNotALottery     = errors.New("not a lottery")
	ErrUnauthorized    = errors.New("unauthorized")
	// The waiting room: a join of a sale without one, and a queued sale's
	// deduct without its token or with one that does not admit the buyer.
	ErrNotQueued         = errors.New("sale not queued")
	ErrAdmissionRequired = errors.New("admission required")
	ErrAdmissionInvalid  = errors.New("admission invalid")
	// ErrNotDefinite: the context ended (or the client closed) before any
	// node gave a definite answer; retry with the same request id.
	ErrNotDefinite = errors.New("no definite answer")
)

// codeErrors maps the contract's error codes onto the sentinels.
var codeErrors = map[string]error{
	"sold_out": ErrSoldOut, "user_limit": ErrUserLimit, "not_started": ErrNotStarted,
	"closed": ErrClosed, "request_id_reused": ErrRequestIDReused, "unknown_sku": ErrUnknownSKU,
	"lottery_sale": ErrLotterySale, "bad_request": ErrBadRequest, "not_found": ErrNotFound,
	"conflict": ErrConflict, "expired": ErrExpired, "invalid_state": ErrInvalidState,
	"entries_closed": ErrEntriesClosed, "not_a_lottery": ErrNotALottery,
	"not_queued": ErrNotQueued, "admission_required": ErrAdmissionRequired, "admission_invalid": ErrAdmissionInvalid,
	"unauthorized": ErrUnauthorized, "client_certificate_required": ErrUnauthorized,
	"cursor_expired": ErrCursorExpired,
}

// Error is a definite refusal by stockd: its HTTP status, the contract's
// error code and detail, and the request id of the call.
type Error struct {
	Status    int
	Code      string
	Detail    string
	RequestID string
}

func (e *Error) Error() string {
	return fmt.Sprintf("stockd: %d %s: %s (request_id %q)", e.Status, e.Code, e.Detail, e.RequestID)
}

// Is matches the sentinel of the error's code.
func (e *Error) Is(target error) bool { return codeErrors[e.Code] == target && target != nil }

// NotDefiniteError is a call that ended without a definite answer: the
// request id to retry with, and the last failure seen. It matches
// ErrNotDefinite, and the context's error when the context ended.
type NotDefiniteError struct {
	RequestID string
	Last      error // the last node's failure (a status, or a network error)
	Cause     error // the context's error, or ErrClientClosed
}

func (e *NotDefiniteError) Error() string {
	return fmt.Sprintf("stockd: no definite answer (%v; last: %v): retry with request_id %q", e.Cause, e.Last, e.RequestID)
}

// Is matches ErrNotDefinite.
func (e *NotDefiniteError) Is(target error) bool { return target == ErrNotDefinite }

// Unwrap gives the cause (context.DeadlineExceeded, context.Canceled, or
// ErrClientClosed).
func (e *NotDefiniteError) Unwrap() error { return e.Cause }

// ErrClientClosed: the Client was closed during the call.
var ErrClientClosed = errors.New("client closed")

// Config is what New needs. Endpoints is required.
type Config struct {
	// Name names the cluster among those of a Sharded client (the
	// rendezvous hash reads it); a lone Client does not need one.
	Name string
	// Endpoints are base URLs of any members ("http://10.0.0.1:8080");
	// the others are found through GET /v1/cluster.
	Endpoints []string
	// ServiceToken is sent as a bearer token on service calls; AdminToken
	// on admin calls (and on service calls when ServiceToken is empty).
	ServiceToken string
	AdminToken   string
	// TLS configures HTTPS to the nodes (nil: the system's defaults).
	TLS *tls.Config
	// HTTPClient replaces the client's own transport (tests); TLS is then
	// the caller's business.
	HTTPClient *http.Client
	// AttemptTimeout bounds one attempt on one node (default 10s, past the
	// node's own 5 s commit wait); the context bounds the whole call.
	AttemptTimeout time.Duration
	// RefreshInterval paces the refresh of the members from /v1/cluster
	// (default 10s; a failing node triggers one sooner).
	RefreshInterval time.Duration
}

// TLSFiles is a Config.TLS from PEM files: the nodes' HTTPS checked
// against the CA bundle caFile (empty: the system's roots), and the
// client certificate certFile with its key keyFile when both are given
// (for nodes started with -http-client-ca).
func TLSFiles(caFile, certFile, keyFile string) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile != "" {
		b, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("read CA bundle: %w", err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(b) {
			return nil, fmt.Errorf("CA bundle %s: no PEM certificate in it", caFile)
		}
	}
	if (certFile == "") != (keyFile == "") {
		return nil, errors.New("a client certificate needs both its file and its key")
	}
	if certFile != "" {
		pair, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("load client certificate: %w", err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg, nil
}

// Defaults.
const (
	attemptTimeoutDefault  = 10 * time.Second
	refreshIntervalDefault = 10 * time.Second
	// skipFor is how long a node that failed a call is passed over while
	// another is there to try.
	skipFor = 2 * time.Second
	// retryBackoffMax bounds the pause between two attempts that were
	// not definite (it doubles from retryBackoffMin).
	retryBackoffMin = 20 * time.Millisecond
	retryBackoffMax = time.Second
	// retryAfterMax bounds how long a 429's Retry-After is waited for.
	retryAfterMax = 30 * time.Second
	// answerBytesMax bounds an answer read into memory.
	answerBytesMax = 4 << 20
)

// Client calls a stockd cluster. Safe for concurrent use.
type Client struct {
	cfg    Config
	http   *http.Client
	scheme string

	mu      sync.Mutex
	nodes   []*member // the members, in the order calls start from
	next    atomic.Uint64
	refresh chan struct{}
	closed  chan struct{}
	done    sync.WaitGroup
	once    sync.Once
}

// member is one node the client calls.
type member struct {
	base      string // "http://host:port"
	skipUntil atomic.Int64
}

// New returns a client of the cluster that Endpoints belong to. It does
// not call the cluster: members are refreshed in the background.
func New(cfg Config) (*Client, error) {
	if len(cfg.Endpoints) == 0 {
		return nil, errors.New("client: Config.Endpoints is empty: give the URL of at least one member")
	}
	scheme := ""
	c := &Client{cfg: cfg, refresh: make(chan struct{}, 1), closed: make(chan struct{})}
	for _, e := range cfg.Endpoints {
		u, err := url.Parse(e)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("client: endpoint %q is not an http:// or https:// URL", e)
		}
		if scheme != "" && u.Scheme != scheme {
			return nil, fmt.Errorf("client: endpoints mix http and https (%q)", e)
		}
		scheme = u.Scheme
		c.nodes = append(c.nodes, &member{base: u.Scheme + "://" + u.Host})
	}
	c.scheme = scheme
	if c.cfg.AttemptTimeout <= 0 {
		c.cfg.AttemptTimeout = attemptTimeoutDefault
	}
	if c.cfg.RefreshInterval <= 0 {
		c.cfg.RefreshInterval = refreshIntervalDefault
	}
	c.http = cfg.HTTPClient
	if c.http == nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.TLSClientConfig = cfg.TLS.Clone() // net/http adds its protocols to it: the caller's stays as it was
		tr.MaxIdleConnsPerHost = 64
		c.http = &http.Client{Transport: tr}
	}
	c.done.Add(1)
	go c.refreshMembers()
	return c, nil
}

// Close stops the background refresh; calls in flight end with
// ErrClientClosed (as NotDefiniteError) at their next attempt.
func (c *Client) Close() error {
	c.once.Do(func() { close(c.closed) })
	c.done.Wait()
	return nil
}

// Deduct is one buyer's attempt to buy Qty units of SKU.
type Deduct struct {
	SKU  string
	User string
	// Qty is the units wanted (0: one).
	Qty int64
	// RequestID identifies the purchase across retries: one id per
	// purchase, the same on every retry of it (empty: the client makes
	// one and returns it in the Order).
	RequestID string
	// NoWait answers as soon as the unit is won (wait=none): the Order is
	// then "pending" until the ledger commits it.
	NoWait bool
	// AdmissionToken is the buyer's Ticket.AdmissionToken, for a sale
	// behind a waiting room.
	AdmissionToken string
}

// Order is what a deduct won, or (with an error) the request id to retry
// with.
type Order struct {
	OrderID   string
	State     string // "sold", "held", "pending"
	SKU       string
	Qty       int64
	RequestID string
	ExpiresAt time.Time // a held order's deadline
}

// Deduct tries to buy d.Qty units of d.SKU for d.User. It returns the
// Order on a win (err nil), an *Error for a definite refusal (errors.Is
// against ErrSoldOut, ErrUserLimit, ...), or a *NotDefiniteError when the
// context ended first. The Order's RequestID is set in every case.
func (c *Client) Deduct(ctx context.Context, d Deduct) (Order, error) {
	if d.RequestID == "" {
		d.RequestID = newRequestID()
	}
	if d.Qty == 0 {
		d.Qty = 1
	}
	out := Order{RequestID: d.RequestID, SKU: d.SKU, Qty: d.Qty}
	fields := map[string]any{"user": d.User, "qty": d.Qty, "request_id": d.RequestID}
	if d.AdmissionToken != "" {
		fields["admission_token"] = d.AdmissionToken
	}
	body, err := json.Marshal(fields)
	if err != nil {
		return out, err
	}
	path := "/v1/skus/" + url.PathEscape(d.SKU) + "/deduct"
	if d.NoWait {
		path += "?wait=none"
	}
	status, answer, err := c.do(ctx, http.MethodPost, path, body, c.serviceToken(), d.RequestID)
	if err != nil {
		return out, err
	}
	if status == http.StatusOK || status == http.StatusAccepted {
		var won struct {
			OrderID   string `json:"order_id"`
			State     string `json:"state"`
			SKU       string `json:"sku"`
			Qty       int64  `json:"qty"`
			ExpiresAt string `json:"expires_at"`
		}
		if err := json.Unmarshal(answer, &won); err != nil {
			return out, fmt.Errorf("stockd: answer %d is not an order (%w); retry with request_id %q", status, err, d.RequestID)
		}
		out.OrderID, out.State, out.SKU, out.Qty = won.OrderID, won.State, won.SKU, won.Qty
		out.ExpiresAt = parseTime(won.ExpiresAt)
		return out, nil
	}
	return out, refusal(status, answer, d.RequestID)
}

// refusal is the *Error of a definite answer that is not a success.
func refusal(status int, answer []byte, requestID string) error {
	var e struct {
		Error  string `json:"error"`
		Detail string `json:"detail"`
	}
	_ = json.Unmarshal(answer, &e)
	if e.Error == "" {
		e.Error = "http_" + strconv.Itoa(status)
	}
	return &Error{Status: status, Code: e.Error, Detail: e.Detail, RequestID: requestID}
}

func (c *Client) serviceToken() string {
	if c.cfg.ServiceToken != "" {
		return c.cfg.ServiceToken
	}
	return c.cfg.AdminToken
}

// definite reports whether an HTTP status is a final answer: everything
// but 503 (not applied), 504 (outcome unknown: may have been applied) and
// 429 (come back later). 502 and other 5xx from a proxy are not definite
// either.
func definite(status int) bool {
	switch {
	case status == http.StatusTooManyRequests:
		return false
	case status >= 500:
		return false
	}
	return true
}

// do runs one call until a definite answer, retrying on the next member
// as the package doc says. requestID names the call in errors.
func (c *Client) do(ctx context.Context, method, path string, body []byte, token, requestID string) (int, []byte, error) {
	return c.doAs(ctx, method, path, body, token, requestID, true)
}

// ErrMaybeApplied: a call that must not be sent twice (Restock) reached a
// node and got no definite answer; read the state to learn whether it
// was applied.
var ErrMaybeApplied = errors.New("may have been applied")

// doAs is do; a call that is not idempotent is sent again only when it
// surely was not applied (503, 429, a failed dial), and otherwise ends in
// a NotDefiniteError whose cause is ErrMaybeApplied.
func (c *Client) doAs(ctx context.Context, method, path string, body []byte, token, requestID string, idempotent bool) (int, []byte, error) {
	var last error
	backoff := retryBackoffMin
	for attempt := 0; ; attempt++ {
		if err := ctx.Err(); err != nil {
			return 0, nil, &NotDefiniteError{RequestID: requestID, Last: last, Cause: err}
		}
		select {
		case <-c.closed:
			return 0, nil, &NotDefiniteError{RequestID: requestID, Last: last, Cause: ErrClientClosed}
		default:
		}
		m := c.pick()
		status, answer, header, err := c.attempt(ctx, m, method, path, body, token)
		if err == nil && definite(status) {
			return status, answer, nil
		}
		var wait time.Duration
		if !idempotent && (err != nil && !dialFailed(err) || err == nil && status == http.StatusGatewayTimeout) {
			if err == nil {
				err = fmt.Errorf("%d %s", status, bytes.TrimSpace(answer))
			}
			return 0, nil, &NotDefiniteError{RequestID: requestID, Last: fmt.Errorf("%s: %w", m.base, err), Cause: ErrMaybeApplied}
		}
		switch {
		case err != nil:
			last = fmt.Errorf("%s: %w", m.base, err)
			c.skip(m)
		case status == http.StatusTooManyRequests:
			last = fmt.Errorf("%s: 429 %s", m.base, bytes.TrimSpace(answer))
			wait = retryAfter(header)
		default:
			last = fmt.Errorf("%s: %d %s", m.base, status, bytes.TrimSpace(answer))
			c.skip(m)
		}
		if wait == 0 {
			wait = backoff
			backoff = min(2*backoff, retryBackoffMax)
		}
		if !c.pause(ctx, wait) {
			return 0, nil, &NotDefiniteError{RequestID: requestID, Last: last, Cause: c.stopCause(ctx)}
		}
	}
}

// dialFailed reports whether err happened before a request could reach
// the node.
func dialFailed(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// retryAfter reads a 429's Retry-After seconds (default one), bounded.
func retryAfter(h http.Header) time.Duration {
	secs, err := strconv.Atoi(strings.TrimSpace(h.Get("Retry-After")))
	if err != nil || secs < 1 {
		secs = 1
	}
	return min(time.Duration(secs)*time.Second, retryAfterMax)
}

// attempt is one try on one member. err is set when no HTTP answer came
// (a dial failure, a dropped connection, the attempt's timeout).
func (c *Client) attempt(ctx context.Context, m *member, method, path string, body []byte, token string) (int, []byte, http.Header, error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.AttemptTimeout+longPoll(ctx))
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, m.base+path, bytes.NewReader(body))
	if err != nil {
		return 0, nil, nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, nil, nil, err
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(io.LimitReader(resp.Body, answerBytesMax))
	if err != nil {
		return 0, nil, nil, err
	}
	return resp.StatusCode, answer, resp.Header, nil
}

// pick returns the next member to call: round robin, passing over those
// skipped recently unless all are.
func (c *Client) pick() *member {
	c.mu.Lock()
	nodes := c.nodes
	c.mu.Unlock()
	start := c.next.Add(1)
	now := time.Now().UnixNano()
	for i := range nodes {
		m := nodes[(start+uint64(i))%uint64(len(nodes))]
		if m.skipUntil.Load() <= now {
			return m
		}
	}
	return nodes[start%uint64(len(nodes))]
}

// skip passes over m for a while and asks for a refresh of the members.
func (c *Client) skip(m *member) {
	m.skipUntil.Store(time.Now().Add(skipFor).UnixNano())
	select {
	case c.refresh <- struct{}{}:
	default:
	}
}

// refreshMembers keeps the member list current from GET /v1/cluster: at
// once, every RefreshInterval, and after a failed call, until Close.
func (c *Client) refreshMembers() {
	defer c.done.Done()
	t := time.NewTicker(c.cfg.RefreshInterval)
	defer t.Stop()
	for {
		c.loadMembers()
		select {
		case <-c.closed:
			return
		case <-t.C:
		case <-c.refresh:
		}
	}
}

// loadMembers asks one member for the cluster's and keeps the given
// endpoints beside them (a member that is down is still asked later).
func (c *Client) loadMembers() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	m := c.pick()
	status, answer, _, err := c.attempt(ctx, m, http.MethodGet, "/v1/cluster", nil, "")
	if err != nil || status != http.StatusOK {
		return
	}
	var st struct {
		Nodes []struct {
			HTTPAddr string `json:"http_addr"`
		} `json:"nodes"`
	}
	if json.Unmarshal(answer, &st) != nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	known := map[string]*member{}
	for _, n := range c.nodes {
		known[n.base] = n
	}
	for _, n := range st.Nodes {
		if n.HTTPAddr == "" {
			continue
		}
		base := c.scheme + "://" + n.HTTPAddr
		if known[base] == nil {
			m := &member{base: base}
			known[base] = m
			c.nodes = append(c.nodes, m)
		}
	}
}

// Members returns the base URLs the client spreads calls over.
func (c *Client) Members() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		out[i] = n.base
	}
	return out
}

// newRequestID is a random request id: 128 bits, hex.
func newRequestID() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("client: crypto/rand failed: " + err.Error())
	}
	return hex.EncodeToString(b[:])
}
