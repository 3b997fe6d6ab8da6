package httpapi

import (
	"context"
	"encoding/json"
	"net"
	"stockd.dev/stockd/engine/control"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"stockd.dev/stockd/engine"
	"stockd.dev/stockd/stock"
)

// fakeEngine answers every deduct with a fixed status and records calls.
type fakeEngine struct {
	status     engine.Status
	retryAfter time.Duration
	lastReq    engine.DeductRequest
	deducts    int
	createErr  error
}

func (f *fakeEngine) Deduct(req *engine.DeductRequest, res *engine.DeductResult) {
	f.deducts++
	f.lastReq = *req
	res.Status = f.status
	if res.Status.Won() {
		res.Order = stock.Order{ID: "n1-1", SKU: string(req.SKU), User: string(req.User), Qty: req.Qty, State: "sold"}
	}
	if res.Status == engine.StatusNotStarted {
		res.StartAt = time.Now().Add(time.Minute)
	}
	res.RetryAfter = f.retryAfter
}
func (f *fakeEngine) CreateSale(string, control.SaleSpec) (bool, error) { return true, f.createErr }
func (f *fakeEngine) Restock(string, int64) error                       { return engine.ErrUnknownSKU }
func (f *fakeEngine) SKU(sku string) (engine.SKUView, bool) {
	return engine.SKUView{Row: stock.SKU{SKU: sku, Total: 1, Available: 1}, State: engine.StateOpen}, sku == "a"
}
func (f *fakeEngine) Order(string) (stock.Order, bool, error) { return stock.Order{}, false, nil }
func (f *fakeEngine) Confirm(string) (stock.Order, error)     { return stock.Order{}, engine.ErrExpired }
func (f *fakeEngine) Cancel(string) (stock.Order, error) {
	return stock.Order{}, engine.ErrInvalidState
}
func (f *fakeEngine) Audit(string) (stock.Audit, engine.LocalAudit, bool, error) {
	return stock.Audit{}, engine.LocalAudit{}, false, nil
}
func (f *fakeEngine) MetricsSnapshot() engine.Snapshot          { return engine.Snapshot{} }
func (f *fakeEngine) NodeAddrs() map[string]string              { return nil }
func (f *fakeEngine) CommitBlocked() bool                       { return false }
func (f *fakeEngine) LeaderReachable() bool                     { return true }
func (f *fakeEngine) Reclaim(string) (int64, error)             { return 0, nil }
func (f *fakeEngine) AppliedIndex() uint64                      { return 0 }
func (f *fakeEngine) WaitApplied(context.Context, uint64) error { return nil }
func (f *fakeEngine) CatchUp(context.Context) error             { return nil }
func (f *fakeEngine) ReadFresh(context.Context, bool) error     { return nil }
func (f *fakeEngine) Vouch() (bool, error)                      { return false, nil }
func (f *fakeEngine) OrderOwner(string) string                  { return "" }
func (f *fakeEngine) Events(context.Context, stock.Cursor, int, time.Duration) (stock.FeedPage, error) {
	return stock.FeedPage{}, nil
}
func (f *fakeEngine) SaleOrders(string, string, string, func(*stock.Order) error) (stock.OrdersSnapshot, error) {
	return stock.OrdersSnapshot{}, nil
}
func (f *fakeEngine) Enter(context.Context, string, string, string) (stock.Entry, error) {
	return stock.Entry{}, control.ErrNotLottery
}
func (f *fakeEngine) EntryStatus(string, string) (stock.EntryStatus, *stock.Order, bool, error) {
	return stock.EntryStatus{}, nil, false, nil
}
func (f *fakeEngine) SaleEntries(string, func(*stock.Entry) error) (uint64, error) { return 0, nil }
func (f *fakeEngine) Join(context.Context, string, string) (stock.SKU, stock.Ticket, error) {
	return stock.SKU{}, stock.Ticket{}, engine.ErrUnknownSKU
}
func (f *fakeEngine) Ticket(context.Context, string, time.Duration) (stock.SKU, stock.Ticket, bool, error) {
	return stock.SKU{}, stock.Ticket{}, false, nil
}
func (f *fakeEngine) Queue(string) (control.QueueView, bool, error) {
	return control.QueueView{}, false, nil
}
func (f *fakeEngine) QueueTickets(string, func(*stock.Ticket) error) error {
	return engine.ErrUnknownSKU
}
func (f *fakeEngine) RotateQueueKey(string) error               { return engine.ErrUnknownSKU }
func (f *fakeEngine) AdmitRate(string) float64                  { return 0 }
func (f *fakeEngine) TicketETA(*stock.SKU, int64) time.Duration { return 0 }
func (f *fakeEngine) QueueCounters() control.QueueCounters      { return control.QueueCounters{} }
func (f *fakeEngine) DeductBatch(reqs []engine.DeductRequest, res []engine.DeductResult) {
	for i := range reqs {
		f.Deduct(&reqs[i], &res[i])
	}
}
func (f *fakeEngine) SKUViews() []engine.SKUView                         { return nil }
func (f *fakeEngine) CloseSale(string) error                             { return nil }
func (f *fakeEngine) ArchiveSale(string) error                           { return nil }
func (f *fakeEngine) Feed() (control.FeedView, error)                    { return control.FeedView{}, nil }
func (f *fakeEngine) AckConsumer(string, stock.Cursor) error             { return nil }
func (f *fakeEngine) AdvanceConsumer(string, stock.Cursor) (bool, error) { return true, nil }
func (f *fakeEngine) DropConsumer(string) error                          { return nil }

func newTestServer(t testing.TB, token string) (*Server, *fakeEngine) {
	fe := &fakeEngine{status: engine.StatusSoldOut}
	cfg := DefaultConfig()
	cfg.AdminToken = token
	s, err := New(cfg, fe, nil, "test")
	if err != nil {
		t.Fatal(err)
	}
	return s, fe
}

var loopback = &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 5000}

func newCtx(method, uri, body string, remote net.Addr) *fasthttp.RequestCtx {
	var req fasthttp.Request
	req.Header.SetMethod(method)
	req.SetRequestURI(uri)
	req.SetBodyString(body)
	ctx := &fasthttp.RequestCtx{}
	ctx.Init(&req, remote, nil)
	return ctx
}

func do(s *Server, method, uri, body string, remote net.Addr) (int, map[string]any) {
	ctx := newCtx(method, uri, body, remote)
	s.handle(ctx)
	var out map[string]any
	_ = json.Unmarshal(ctx.Response.Body(), &out)
	return ctx.Response.StatusCode(), out
}

func TestHandler_DeductMapsEveryStatus(t *testing.T) {
	s, fe := newTestServer(t, "")
	f := func(status engine.Status, wantCode int, wantErr string) {
		t.Helper()
		fe.status = status
		code, out := do(s, "POST", "/v1/skus/a/deduct", `{"user":"u","qty":2,"request_id":"r"}`, loopback)
		if code != wantCode || (wantErr != "" && out["error"] != wantErr) {
			t.Fatalf("status %s: %d %v, want %d %s", status, code, out, wantCode, wantErr)
		}
	}
	f(engine.StatusOK, 200, "")
	f(engine.StatusAccepted, 202, "")
	f(engine.StatusSoldOut, 409, "sold_out")
	f(engine.StatusUserLimit, 409, "user_limit")
	f(engine.StatusNotStarted, 425, "not_started")
	f(engine.StatusUnknownSKU, 404, "unknown_sku")
	f(engine.StatusRateLimited, 429, "rate_limited")
	f(engine.StatusTryAgain, 429, "try_again")
	f(engine.StatusUnavailable, 503, "unavailable")
	f(engine.StatusOutcomeUnknown, 504, "outcome_unknown")
	if string(fe.lastReq.User) != "u" || fe.lastReq.Qty != 2 || string(fe.lastReq.RequestID) != "r" {
		t.Fatalf("engine saw %+v", fe.lastReq)
	}
}

func TestHandler_DeductRejectsBadBodiesBeforeTheEngine(t *testing.T) {
	s, fe := newTestServer(t, "")
	for _, body := range []string{
		``, `nul`, `[]`, `"x"`, `{"qty":1}`, `{"user":""}`, `{"user":1}`,
		`{"user":"u","qty":0}`, `{"user":"u","qty":1001}`, `{"user":"u","qty":2.5}`, `{"user":"u","qty":"2"}`,
		`{"user":"u","request_id":5}`, `{"user":"` + string(make([]byte, 200)) + `"}`,
	} {
		if code, out := do(s, "POST", "/v1/skus/a/deduct", body, loopback); code != 400 || out["error"] != "bad_request" {
			t.Fatalf("body %q: %d %v, want 400 bad_request", body, code, out)
		}
	}
	if fe.deducts != 0 {
		t.Fatalf("engine called %d times for bad bodies", fe.deducts)
	}
}

func TestHandler_AdminNeedsTokenOrLoopback(t *testing.T) {
	remote := &net.TCPAddr{IP: net.IPv4(192, 0, 2, 10), Port: 5000} // a documentation address; no traffic is sent
	open, _ := newTestServer(t, "")
	if code, out := do(open, "PUT", "/v1/skus/a", `{"total":1}`, remote); code != 403 || out["error"] != "forbidden" {
		t.Fatalf("remote admin without token: %d %v", code, out)
	}
	if code, _ := do(open, "PUT", "/v1/skus/a", `{"total":1}`, loopback); code != 201 {
		t.Fatalf("loopback admin without token: %d", code)
	}
	locked, _ := newTestServer(t, "tok")
	if code, _ := do(locked, "PUT", "/v1/skus/a", `{"total":1}`, loopback); code != 401 {
		t.Fatalf("loopback admin, token configured, none sent: %d", code)
	}
	ctx := newCtx("PUT", "/v1/skus/a", `{"total":1}`, remote)
	ctx.Request.Header.Set("Authorization", "Bearer tok")
	locked.handle(ctx)
	if ctx.Response.StatusCode() != 201 {
		t.Fatalf("remote admin with token: %d", ctx.Response.StatusCode())
	}
}

func TestHandler_OrderCommandsMapErrors(t *testing.T) {
	s, _ := newTestServer(t, "")
	if code, out := do(s, "POST", "/v1/orders/x/confirm", "", loopback); code != 409 || out["error"] != "expired" {
		t.Fatalf("confirm: %d %v", code, out)
	}
	if code, out := do(s, "POST", "/v1/orders/x/cancel", "", loopback); code != 409 || out["error"] != "invalid_state" {
		t.Fatalf("cancel: %d %v", code, out)
	}
	if code, out := do(s, "POST", "/v1/skus/a/restock", `{"qty":1}`, loopback); code != 404 || out["error"] != "unknown_sku" {
		t.Fatalf("restock: %d %v", code, out)
	}
}

func TestHandler_PanicIsA500NotACrash(t *testing.T) {
	s, _ := newTestServer(t, "")
	s.engine = nil // every engine call now panics
	if code, out := do(s, "GET", "/v1/skus/a", "", loopback); code != 500 || out["error"] != "internal" {
		t.Fatalf("panicking handler: %d %v", code, out)
	}
}

func TestHandler_SoldOutDeductDoesNotAllocate(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are meaningless under the race detector; run without -race")
	}
	s, _ := newTestServer(t, "")
	ctx := newCtx("POST", "/v1/skus/a/deduct", `{"user":"u123","qty":1,"request_id":"req-123"}`, loopback)
	s.handle(ctx) // warm the pools
	allocs := testing.AllocsPerRun(1000, func() {
		ctx.Response.Reset()
		s.handle(ctx)
	})
	if ctx.Response.StatusCode() != 409 {
		t.Fatalf("status %d", ctx.Response.StatusCode())
	}
	if allocs > 0 {
		t.Fatalf("sold-out deduct allocates %.1f times per request", allocs)
	}
}

func TestHandler_RateLimitedSaysWhenToRetry(t *testing.T) {
	s, fe := newTestServer(t, "")
	f := func(retryAfter time.Duration, want string) {
		t.Helper()
		fe.status, fe.retryAfter = engine.StatusRateLimited, retryAfter
		ctx := newCtx("POST", "/v1/skus/a/deduct", `{"user":"u"}`, loopback)
		s.handle(ctx)
		if ctx.Response.StatusCode() != 429 || string(ctx.Response.Header.Peek("Retry-After")) != want {
			t.Fatalf("retry after %s: %d Retry-After %q, want 429 %q", retryAfter, ctx.Response.StatusCode(), ctx.Response.Header.Peek("Retry-After"), want)
		}
	}
	f(0, "1")
	f(100*time.Millisecond, "1")
	f(2500*time.Millisecond, "3")
}

// TestServer_DetailsSayWhatHappened: a path ending in a slash is no
// route (not a read of a sale with a slash in its name), and an answer's
// detail reads as written, angle brackets included.
func TestServer_DetailsSayWhatHappened(t *testing.T) {
	s, _ := newTestServer(t, "svc")
	if code, out := do(s, "POST", "/v1/skus/p/restock/", `{"qty":1}`, loopback); code != 404 || out["error"] != "not_found" {
		t.Fatalf("POST /v1/skus/p/restock/: %d %v, want 404 not_found", code, out)
	}
	cfg := DefaultConfig()
	cfg.ServiceToken = "svc"
	guarded, err := New(cfg, &fakeEngine{}, nil, "test")
	if err != nil {
		t.Fatal(err)
	}
	ctx := newCtx("POST", "/v1/skus/p/deduct", `{"user":"u"}`, loopback)
	guarded.handle(ctx)
	if body := string(ctx.Response.Body()); ctx.Response.StatusCode() != 401 || !strings.Contains(body, "Bearer <service token>") {
		t.Fatalf("a deduct without the token: %d %s, want 401 whose detail reads <service token> as written", ctx.Response.StatusCode(), body)
	}
}
