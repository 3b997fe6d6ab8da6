package peer

import (
	"bytes"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
)

// Client carries a node's calls to its peers: forwarded commands, read
// indexes, status probes, relayed public calls. Calls name the node they
// go to; the client resolves its address (the HTTP address it registered
// in the ledger, or its node port when the cluster runs on node
// certificates), keeps a small connection pool per address and adds this
// node's credentials. Safe for concurrent use.
type Client struct {
	cfg ClientConfig

	mu      sync.Mutex
	clients map[string]*fasthttp.HostClient
}

// ClientConfig says how a node reaches its peers.
type ClientConfig struct {
	// Self is this node's id, sent with every call.
	Self string
	// Secret is the cluster secret, sent with every call (empty on a
	// cluster of node certificates: the connection itself proves who
	// calls).
	Secret string
	// Resolve gives the address a node's calls go to ("" while unknown).
	Resolve func(id string) string
	// Dial connects to an address (nil: plain TCP).
	Dial DialFunc
	// Cluster is this node's cluster identity, sent with every call when
	// it has one (nil or "": none).
	Cluster func() string
}

// DialFunc dials a peer's HTTP address (fasthttp's dial hook).
type DialFunc = fasthttp.DialFunc

// NewClient returns a client as cfg says.
func NewClient(cfg ClientConfig) *Client {
	if cfg.Resolve == nil {
		cfg.Resolve = func(string) string { return "" }
	}
	return &Client{cfg: cfg, clients: map[string]*fasthttp.HostClient{}}
}

// Do sends req (its URI a path) to node id with this node's credentials
// and reads the answer into resp. An error for which NotSent is true
// means the request surely did not reach the peer; any other, that it
// may have.
func (c *Client) Do(id string, req *fasthttp.Request, resp *fasthttp.Response, timeout time.Duration) error {
	addr := c.cfg.Resolve(id)
	if addr == "" {
		return fmt.Errorf("%w: no address known for node %s", ErrNotSent, id)
	}
	req.URI().SetScheme("http")
	req.URI().SetHost(addr)
	req.Header.Set(headerNode, c.cfg.Self)
	if c.cfg.Cluster != nil {
		if id := c.cfg.Cluster(); id != "" {
			req.Header.Set(headerCluster, id)
		}
	}
	if c.cfg.Secret != "" {
		req.Header.Set(headerSecret, c.cfg.Secret)
	}
	return c.client(addr).DoTimeout(req, resp, timeout)
}

func (c *Client) client(addr string) *fasthttp.HostClient {
	c.mu.Lock()
	defer c.mu.Unlock()
	hc, ok := c.clients[addr]
	if !ok {
		hc = &fasthttp.HostClient{
			Addr: addr, Dial: c.cfg.Dial, MaxConns: connsMax, MaxConnWaitTimeout: connWaitMax,
			MaxResponseBodySize:       MaxBodyBytes,
			MaxIdemponentCallAttempts: 1, // a proposal must not be sent twice by the client
		}
		c.clients[addr] = hc
	}
	return hc
}

// NotSent reports whether an error of Do happened before the request
// could reach the peer.
func (c *Client) NotSent(err error) bool { return notSent(err) }

func notSent(err error) bool {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return true
	}
	return errors.Is(err, ErrNotSent) || errors.Is(err, fasthttp.ErrDialTimeout) || errors.Is(err, fasthttp.ErrNoFreeConns)
}

// Propose sends one encoded command to the leader, node id, and returns
// the HTTP status and the answer (a copy). An error wraps ErrNotSent when
// nothing reached the peer; otherwise the command may have arrived.
func (c *Client) Propose(id string, command []byte, timeout time.Duration) (int, []byte, error) {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(routePropose)
	req.Header.SetMethod(fasthttp.MethodPost)
	req.Header.SetContentType(contentTypeCommand)
	req.Header.Set(headerWireVersion, WireVersion)
	req.SetBodyRaw(command)
	if err := c.Do(id, req, resp, timeout); err != nil {
		if notSent(err) {
			return 0, nil, fmt.Errorf("%w: %w", ErrNotSent, err)
		}
		return 0, nil, err
	}
	return resp.StatusCode(), bytes.Clone(resp.Body()), nil
}

// Status reads node id's view of itself (GET /internal/v1/status, the
// JSON of httpapi.ClusterStatus) into out.
func (c *Client) Status(id string, timeout time.Duration, out any) error {
	return c.getJSON(id, routeStatus, timeout, out)
}

// ReadIndex asks the leader, node id, for an index every write the
// cluster acknowledged before the call has reached; with lease, one it
// vouches for on its lease instead of a quorum round (a leader of a
// version before that ignores the argument and asks its quorum).
func (c *Client) ReadIndex(id string, timeout time.Duration, lease bool) (uint64, error) {
	var out readIndexJSON
	path := routeReadIndex
	if lease {
		path += "?" + argLease
	}
	if err := c.getJSON(id, path, timeout, &out); err != nil {
		return 0, err
	}
	return out.Index, nil
}

func (c *Client) getJSON(id, path string, timeout time.Duration, out any) error {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(path)
	if err := c.Do(id, req, resp, timeout); err != nil {
		return err
	}
	if resp.StatusCode() != fasthttp.StatusOK {
		return fmt.Errorf("node %s %s: %d", id, path, resp.StatusCode())
	}
	return json.Unmarshal(resp.Body(), out)
}

// Join asks a running cluster, through any member's base URL, to add node
// id at raftAddr (POST /v1/cluster/join with the admin token and the
// cluster secret, whichever are set) and returns its status and answer.
// tlsCfg checks an https URL's server (nil: the system's roots).
func Join(baseURL string, body []byte, adminToken, secret string, tlsCfg *tls.Config, timeout time.Duration) (int, string, error) {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(baseURL + "/v1/cluster/join")
	req.Header.SetMethod(fasthttp.MethodPost)
	req.Header.SetContentType(contentTypeJSON)
	if adminToken != "" {
		req.Header.Set(fasthttp.HeaderAuthorization, "Bearer "+adminToken)
	}
	if secret != "" {
		req.Header.Set(headerSecret, secret)
	}
	req.SetBody(body)
	c := &fasthttp.Client{TLSConfig: tlsCfg}
	if err := c.DoTimeout(req, resp, timeout); err != nil {
		return 0, "", err
	}
	return resp.StatusCode(), string(bytes.TrimSpace(resp.Body())), nil
}
