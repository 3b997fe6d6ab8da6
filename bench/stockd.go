package bench

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
)

// httpClients is one connection pool per target, shared by the HTTP
// strategies; worker w always uses target w mod n.
type httpClients []*fasthttp.HostClient

// newHTTPClients makes the pools; an https:// target is checked with
// tlsCfg (nil: the system's roots).
func newHTTPClients(targets []string, conns int, tlsCfg *tls.Config) httpClients {
	out := make(httpClients, len(targets))
	for i, t := range targets {
		addr, secure := strings.CutPrefix(t, "https://")
		out[i] = &fasthttp.HostClient{
			// A few connections beyond the workers' serve the samplers.
			Addr: strings.TrimPrefix(addr, "http://"), MaxConns: conns + 4, MaxConnWaitTimeout: requestTimeout,
			ReadTimeout: requestTimeout, WriteTimeout: requestTimeout,
			MaxIdemponentCallAttempts: 1,
		}
		if secure {
			out[i].IsTLS, out[i].TLSConfig = true, tlsCfg
		}
	}
	return out
}

// url is path on hc's node.
func url(hc *fasthttp.HostClient, path string) string {
	if hc.IsTLS {
		return "https://" + hc.Addr + path
	}
	return "http://" + hc.Addr + path
}

func (c httpClients) do(worker int, method, path, token string, body []byte) (int, []byte, error) {
	return c.doAppend(worker, method, path, token, body, nil)
}

// doAppend is do with the answer's body appended to dst.
func (c httpClients) doAppend(worker int, method, path, token string, body, dst []byte) (int, []byte, error) {
	hc := c[worker%len(c)]
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(url(hc, path))
	req.Header.SetMethod(method)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if body != nil {
		req.Header.SetContentType("application/json")
		req.SetBodyRaw(body)
	}
	if err := hc.DoTimeout(req, resp, requestTimeout); err != nil {
		return 0, nil, err
	}
	return resp.StatusCode(), append(dst, resp.Body()...), nil
}

// stockdStrategy sells through stockd's HTTP API.
type stockdStrategy struct {
	name    string
	noWait  bool
	nodes   int
	clients httpClients // the deducts' (and the holds' confirms and cancels)
	// control serves every other call (setup, reads, audits) on
	// connections of its own: a node's event loop hands a connection to
	// fasthttp at its first request that is not a deduct, for good, and
	// the deducts measured must not run on such connections.
	control httpClients
	token   string // admin token: sale setup and audits
	service string // service token: deducts and orders
	// deductPaths is each SKU's deduct path, built once per scenario.
	deductPaths []string
	sc          *Scenario
	pids        []int // the nodes' processes, when the harness launched them
	noFeed      bool  // the launched nodes record no order feed
	noAudit     bool  // Final reads the SKU rows, not their audits (-no-final-audit)
	tls         bool  // the nodes speak HTTPS (and TLS among themselves when launched so)
	peerTLS     bool  // the launched nodes speak TLS among themselves, HTTP to clients
}

func (s *stockdStrategy) serverPIDs() []int { return s.pids }

func newStockd(targets []string, conns int, token, service string, noWait bool, tlsCfg *tls.Config) *stockdStrategy {
	name := "stockd-commit"
	if noWait {
		name = "stockd-none"
	}
	return &stockdStrategy{name: name, noWait: noWait, nodes: len(targets), clients: newHTTPClients(targets, conns, tlsCfg),
		control: newHTTPClients(targets, 64, tlsCfg), token: token, service: service, tls: tlsCfg != nil && strings.HasPrefix(targets[0], "https://")}
}

func (s *stockdStrategy) Name() string {
	switch {
	case s.tls:
		return s.plainName() + " TLS"
	case s.peerTLS:
		return s.plainName() + " peer TLS"
	}
	return s.plainName()
}

func (s *stockdStrategy) plainName() string {
	switch {
	case s.nodes > 1 && s.noFeed:
		return fmt.Sprintf("%s (%d nodes, no feed)", s.name, s.nodes)
	case s.nodes > 1:
		return fmt.Sprintf("%s (%d nodes)", s.name, s.nodes)
	case s.noFeed:
		return s.name + " (no feed)"
	}
	return s.name
}

func (s *stockdStrategy) Durability() string {
	switch {
	case s.noWait:
		return "none at answer; raft commit follows"
	case s.nodes > 1:
		return fmt.Sprintf("raft quorum of %d, fsync", s.nodes)
	}
	return "fsync (raft log; ledger behind)"
}

func (s *stockdStrategy) Supports(*Scenario) string { return "" }
func (s *stockdStrategy) Close() error              { return nil }

func (s *stockdStrategy) Setup(ctx context.Context, sc *Scenario) error {
	s.sc = sc
	s.deductPaths = make([]string, len(sc.SKUs))
	for k, sku := range sc.SKUs {
		s.deductPaths[k] = "/v1/skus/" + sku + "/deduct"
		if s.noWait {
			s.deductPaths[k] += "?wait=none"
		}
	}
	for k, sku := range sc.SKUs {
		body := fmt.Sprintf(`{"total":%d}`, sc.Units[k])
		if sc.HoldTTL > 0 {
			body = fmt.Sprintf(`{"total":%d,"hold_ttl":%q}`, sc.Units[k], sc.HoldTTL.String())
		}
		code, answer, err := s.control.do(0, fasthttp.MethodPut, "/v1/skus/"+sku, s.token, []byte(body))
		if err != nil {
			return fmt.Errorf("create sale %s: %w", sku, err)
		}
		if code != fasthttp.StatusCreated && code != fasthttp.StatusOK {
			return fmt.Errorf("create sale %s: %d %s", sku, code, answer)
		}
	}
	// Followers learn of a sale when they apply it: start once every
	// target knows every SKU.
	deadline := time.Now().Add(10 * time.Second)
	for w := range s.clients {
		for _, sku := range sc.SKUs {
			for {
				code, _, err := s.control.do(w, fasthttp.MethodGet, "/v1/skus/"+sku, "", nil)
				if err == nil && code == fasthttp.StatusOK {
					break
				}
				if time.Now().After(deadline) {
					return fmt.Errorf("sale %s not visible on %s after 10s", sku, s.control[w].Addr)
				}
				time.Sleep(10 * time.Millisecond)
			}
		}
	}
	return nil
}

func (s *stockdStrategy) Deduct(_ context.Context, worker int, r *Request) Outcome {
	code, a, err := s.clients.deduct(worker, s.deductPaths[r.SKU], s.service, r)
	if err != nil {
		return Outcome{Err: err}
	}
	switch {
	case code == fasthttp.StatusOK || code == fasthttp.StatusAccepted:
		return Outcome{Win: true, OrderID: a.OrderID}
	case code == fasthttp.StatusConflict:
		return Outcome{Reason: a.Error}
	}
	return Outcome{Err: fmt.Errorf("%d %s", code, a.Error)}
}

// afterWinPendingWait bounds how long a wait=none winner waits for its
// order to leave pending before it pays or cancels.
const afterWinPendingWait = 2 * time.Second

func (s *stockdStrategy) AfterWin(_ context.Context, worker int, _ *Request, orderID string, fate int) (bool, error) {
	var op string
	switch fate {
	case 0:
		op = "confirm"
	case 1:
		op = "cancel"
	default:
		return false, nil // the buyer walks away; the hold expires
	}
	deadline := time.Now().Add(afterWinPendingWait)
	for {
		code, answer, err := s.clients.do(worker, fasthttp.MethodPost, "/v1/orders/"+orderID+"/"+op, s.service, nil)
		switch {
		case err != nil:
			return false, err
		case code == fasthttp.StatusOK:
			return fate == 0, nil
		case code == fasthttp.StatusConflict:
			return false, nil // expired before the buyer paid
		case code == fasthttp.StatusNotFound && time.Now().Before(deadline):
			// wait=none: the order is still pending; the ledger has not
			// committed it yet.
			time.Sleep(5 * time.Millisecond)
			continue
		}
		return false, fmt.Errorf("%s %s: %d %s", op, orderID, code, answer)
	}
}

func (s *stockdStrategy) Remaining(context.Context) (int64, error) {
	var n int64
	for _, sku := range s.sc.SKUs {
		code, answer, err := s.control.do(0, fasthttp.MethodGet, "/v1/skus/"+sku, "", nil)
		if err != nil || code != fasthttp.StatusOK {
			return 0, fmt.Errorf("read %s: %d %v", sku, code, err)
		}
		var v struct {
			Remaining int64 `json:"remaining"`
		}
		if err := json.Unmarshal(answer, &v); err != nil {
			return 0, err
		}
		n += v.Remaining
	}
	return n, nil
}

// Final audits every SKU on the first node once its takes in flight have
// settled (wait=none answers before commit).
func (s *stockdStrategy) Final(context.Context) (Final, error) {
	f := Final{Valid: true}
	if s.noAudit {
		return s.finalFromRows()
	}
	for _, sku := range s.sc.SKUs {
		var a struct {
			OK        bool             `json:"ok"`
			Problem   string           `json:"problem"`
			Total     int64            `json:"total"`
			Available int64            `json:"available"`
			Leased    map[string]int64 `json:"leased"`
			Held      int64            `json:"held"`
			Sold      int64            `json:"sold"`
			Local     struct {
				TakesInFlight int64 `json:"takes_in_flight"`
			} `json:"local"`
		}
		deadline := time.Now().Add(30 * time.Second)
		for {
			code, answer, err := s.control.do(0, fasthttp.MethodGet, "/v1/skus/"+sku+"/audit", s.token, nil)
			if err != nil || code != fasthttp.StatusOK {
				return f, fmt.Errorf("audit %s: %d %v", sku, code, err)
			}
			if err := json.Unmarshal(answer, &a); err != nil {
				return f, fmt.Errorf("decode audit of %s: %w", sku, err)
			}
			if a.Local.TakesInFlight == 0 || time.Now().After(deadline) {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		var leased int64
		for _, v := range a.Leased {
			leased += v
		}
		f.Sold += a.Sold + a.Held
		f.Remaining += a.Available + leased
		if !a.OK {
			f.Valid = false
			f.Detail += sku + ": " + a.Problem + "; "
		}
	}
	return f, nil
}

// finalFromRows is Final from each SKU's row (GET /v1/skus/{sku}) instead
// of its audit: the units sold and left, without the recount.
func (s *stockdStrategy) finalFromRows() (Final, error) {
	f := Final{Valid: true}
	for _, sku := range s.sc.SKUs {
		var row struct {
			Available int64 `json:"available"`
			Leased    int64 `json:"leased"`
			Held      int64 `json:"held"`
			Sold      int64 `json:"sold"`
		}
		code, answer, err := s.control.do(0, fasthttp.MethodGet, "/v1/skus/"+sku, s.token, nil)
		if err != nil || code != fasthttp.StatusOK {
			return f, fmt.Errorf("read sku %s: %d %v", sku, code, err)
		}
		if err := json.Unmarshal(answer, &row); err != nil {
			return f, fmt.Errorf("decode sku %s: %w", sku, err)
		}
		f.Sold += row.Sold + row.Held
		f.Remaining += row.Available + row.Leased
	}
	return f, nil
}

// noopBody is what the no-op server answers to everything.
var noopBody = []byte(`{"error":"sold_out","detail":"no units left"}` + "\n")

// ServeNoop serves the no-op handler on addr until ctx ends: the HTTP floor
// the bench compares stockd against (stockd noop-server, started by the
// bench as a process of its own, as stockd is).
func ServeNoop(ctx context.Context, addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", addr, err)
	}
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		ctx.SetStatusCode(fasthttp.StatusConflict)
		ctx.SetContentType("application/json")
		ctx.SetBody(noopBody)
	}}
	go func() {
		<-ctx.Done()
		srv.Shutdown()
	}()
	return srv.Serve(ln)
}

// noopStrategy loads a no-op server process: every request is answered
// with a fixed sold_out body.
type noopStrategy struct {
	noHolds
	proc    *launched
	clients httpClients
}

func newNoop(binary, dir string, conns int) (*noopStrategy, error) {
	l, err := launchNoop(binary, dir)
	if err != nil {
		return nil, err
	}
	return &noopStrategy{proc: l, clients: newHTTPClients([]string{l.url}, conns, nil)}, nil
}

func (n *noopStrategy) Name() string                           { return "noop" }
func (n *noopStrategy) Durability() string                     { return "n/a (answers sold_out)" }
func (n *noopStrategy) Supports(s *Scenario) string            { return supportsNoHolds(s) }
func (n *noopStrategy) Setup(context.Context, *Scenario) error { return nil }
func (n *noopStrategy) Remaining(context.Context) (int64, error) {
	return 0, nil
}
func (n *noopStrategy) Final(context.Context) (Final, error) { return Final{Valid: true}, nil }
func (n *noopStrategy) Close() error                         { return n.proc.stop() }
func (n *noopStrategy) serverPIDs() []int                    { return []int{n.proc.cmd.Process.Pid} }

func (n *noopStrategy) Deduct(_ context.Context, worker int, r *Request) Outcome {
	code, a, err := n.clients.deduct(worker, "/v1/skus/noop/deduct", "", r)
	if err != nil {
		return Outcome{Err: err}
	}
	if code != fasthttp.StatusConflict {
		return Outcome{Err: errors.New("noop server answered " + fmt.Sprint(code))}
	}
	return Outcome{Reason: a.Error}
}

// Verify reads every order a wait=none buyer was told it won: an order
// that is sold or held at the end was committed; one that is missing was a
// qualification the ledger later turned down (or a crash lost).
func (s *stockdStrategy) Verify(_ context.Context, orderIDs []string) (int, int, error) {
	if !s.noWait {
		return len(orderIDs), 0, nil
	}
	// A request id sent to two nodes at once may have been accepted under
	// two order ids; both read as the one order the ledger kept. Count
	// each kept order once.
	var mu sync.Mutex
	keptIDs := map[string]bool{}
	var unresolved atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	workers := min(len(s.clients)*16, 64)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := w; i < len(orderIDs); i += workers {
				code, answer, err := s.control.do(w, fasthttp.MethodGet, "/v1/orders/"+orderIDs[i], s.service, nil)
				if err != nil {
					firstErr.CompareAndSwap(nil, err)
					return
				}
				var o struct {
					ID    string `json:"order_id"`
					State string `json:"state"`
				}
				if code == fasthttp.StatusOK && json.Unmarshal(answer, &o) == nil && (o.State == "sold" || o.State == "held") {
					mu.Lock()
					keptIDs[o.ID] = true
					mu.Unlock()
				} else {
					unresolved.Add(1)
				}
			}
		}(w)
	}
	wg.Wait()
	if err, _ := firstErr.Load().(error); err != nil {
		return len(keptIDs), int(unresolved.Load()), fmt.Errorf("verify orders: %w", err)
	}
	return len(keptIDs), int(unresolved.Load()), nil
}
