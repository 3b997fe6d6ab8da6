package peer

import (
	"bytes"
	"context"
	"crypto/subtle"
	"encoding/json"
	"log/slog"
	"strconv"

	"github.com/valyala/fasthttp"
)

// Proposals is the leader's side of the propose route: it decodes,
// checks and proposes one command that node fromNode forwarded, and
// returns the status and answer to send back. The body is only valid
// during the call.
type Proposals interface {
	HandleForwarded(fromNode string, body []byte) (status int, answer []byte)
}

// Node is what the service reads of its node.
type Node interface {
	// Status is the node's view of itself, answered as JSON on the status
	// route (httpapi.ClusterStatus).
	Status() any
	// LeaderReadIndex is, on the leader, an index every write the cluster
	// acknowledged before the call has reached; an error elsewhere. With
	// lease, on the leader's lease rather than a quorum round.
	LeaderReadIndex(ctx context.Context, lease bool) (uint64, error)
}

// Conn is a node-to-node connection whose certificate proved which node
// it comes from (the node port's connections).
type Conn interface {
	PeerID() string
}

// ServiceConfig says who the service answers and with what.
type ServiceConfig struct {
	// Secret is the cluster secret ("" with node certificates, or on a
	// node that takes no internal calls).
	Secret string
	// TLS: the cluster runs on node certificates; internal calls are
	// taken only from node-port connections (Conn), in the name their
	// certificate gives, and Secret is not used.
	TLS bool
	// ClusterID, when set, is this node's cluster identity (a restored
	// cluster's; "" for none): calls that name another are refused.
	ClusterID func() string
	Node      Node
	// Proposals answers forwarded commands; nil refuses them.
	Proposals Proposals
	Logger    *slog.Logger
}

// Service answers the internal routes of one node. Safe for concurrent
// use.
type Service struct {
	cfg    ServiceConfig
	logger *slog.Logger
}

// NewService returns the service cfg describes.
func NewService(cfg ServiceConfig) *Service {
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Service{cfg: cfg, logger: logger.With("component", "peer")}
}

// Handle answers a request under RoutePrefix: it checks that the caller
// is a node of this cluster, then serves the route.
func (s *Service) Handle(ctx *fasthttp.RequestCtx) {
	if !s.admit(ctx) {
		return
	}
	switch string(ctx.Path()) {
	case routePropose:
		if s.allow(ctx, fasthttp.MethodPost) {
			s.handlePropose(ctx)
		}
	case routeStatus:
		if s.allow(ctx, fasthttp.MethodGet) {
			writeJSON(ctx, fasthttp.StatusOK, s.cfg.Node.Status())
		}
	case routeReadIndex:
		if s.allow(ctx, fasthttp.MethodGet) {
			s.handleReadIndex(ctx)
		}
	default:
		writeError(ctx, fasthttp.StatusNotFound, "not_found", "no such internal route")
	}
}

// FromPeer reports whether the request comes from another node of the
// cluster: over a node-port connection on a cluster of node certificates,
// with the cluster secret on one without (never true without either).
func (s *Service) FromPeer(ctx *fasthttp.RequestCtx) bool {
	if s.cfg.TLS {
		_, ok := ctx.Conn().(Conn)
		return ok
	}
	if s.cfg.Secret == "" {
		return false
	}
	return subtle.ConstantTimeCompare(ctx.Request.Header.Peek(headerSecret), []byte(s.cfg.Secret)) == 1
}

// name is the node a peer's request comes from: its certificate's name on
// a cluster of node certificates, the name it gives otherwise.
func (s *Service) name(ctx *fasthttp.RequestCtx) string {
	if pc, ok := ctx.Conn().(Conn); ok && s.cfg.TLS {
		return pc.PeerID()
	}
	return string(ctx.Request.Header.Peek(headerNode))
}

// admit checks that an internal call comes from another node: over the
// node port on a cluster of node certificates, where a peer that names
// another node than its certificate does is refused; with the cluster
// secret otherwise. Without either the internal routes are not served.
func (s *Service) admit(ctx *fasthttp.RequestCtx) bool {
	if own := s.clusterID(); own != "" {
		if said := string(ctx.Request.Header.Peek(headerCluster)); said != own {
			s.logger.Warn("refused a node-to-node call of another cluster", "peer", string(ctx.Request.Header.Peek(headerNode)), "peer_addr", ctx.RemoteAddr().String(), "its_cluster", said, "cluster", own, "path", string(ctx.Path()))
			writeError(ctx, fasthttp.StatusForbidden, "other_cluster", "this node belongs to cluster "+own+"; the call names "+strconv.Quote(said))
			return false
		}
	}
	if s.cfg.TLS {
		pc, ok := ctx.Conn().(Conn)
		if !ok {
			writeError(ctx, fasthttp.StatusNotFound, "not_found", "internal routes are served on the node port only")
			return false
		}
		if said := ctx.Request.Header.Peek(headerNode); len(said) > 0 && string(said) != pc.PeerID() {
			s.logger.Warn("refused a node-to-node call in another node's name", "peer", pc.PeerID(), "named", string(said), "peer_addr", ctx.RemoteAddr().String(), "path", string(ctx.Path()))
			writeError(ctx, fasthttp.StatusForbidden, "forbidden", "node "+strconv.Quote(pc.PeerID())+" may not call in the name of "+strconv.Quote(string(said)))
			return false
		}
		return true
	}
	if s.cfg.Secret == "" {
		writeError(ctx, fasthttp.StatusNotFound, "not_found", "internal routes are off: this node has no -cluster-secret")
		return false
	}
	if s.FromPeer(ctx) {
		return true
	}
	writeError(ctx, fasthttp.StatusForbidden, "forbidden", "internal routes need the cluster secret")
	return false
}

func (s *Service) clusterID() string {
	if s.cfg.ClusterID == nil {
		return ""
	}
	return s.cfg.ClusterID()
}

func (s *Service) allow(ctx *fasthttp.RequestCtx, method string) bool {
	if string(ctx.Method()) == method {
		return true
	}
	ctx.Response.Header.Set(fasthttp.HeaderAllow, method)
	writeError(ctx, fasthttp.StatusMethodNotAllowed, "method_not_allowed", "use "+method)
	return false
}

func (s *Service) handlePropose(ctx *fasthttp.RequestCtx) {
	if v := ctx.Request.Header.Peek(headerWireVersion); string(v) != WireVersion {
		writeError(ctx, ProposeMalformed, "bad_request", "internal wire version "+strconv.Quote(string(v))+" not spoken here (want "+WireVersion+")")
		return
	}
	if s.cfg.Proposals == nil {
		writeError(ctx, ProposeUnavailable, "unavailable", "this node takes no forwarded commands")
		return
	}
	from := s.name(ctx)
	status, answer := s.cfg.Proposals.HandleForwarded(from, ctx.PostBody())
	if status == ProposeForbidden {
		s.logger.Warn("refused a forwarded command", "peer", from, "peer_addr", ctx.RemoteAddr().String(), "why", string(bytes.TrimSpace(answer)))
	}
	ctx.SetStatusCode(status)
	if status == fasthttp.StatusOK {
		ctx.SetContentType(contentTypeCommand)
	} else {
		ctx.SetContentType(contentTypeJSON)
	}
	ctx.SetBody(answer)
}

func (s *Service) handleReadIndex(ctx *fasthttp.RequestCtx) {
	wait, cancel := context.WithTimeout(context.Background(), readIndexWait)
	defer cancel()
	index, err := s.cfg.Node.LeaderReadIndex(wait, ctx.QueryArgs().Has(argLease))
	if err != nil {
		writeError(ctx, fasthttp.StatusServiceUnavailable, "unavailable", err.Error())
		return
	}
	writeJSON(ctx, fasthttp.StatusOK, readIndexJSON{Index: index})
}

// ErrorBody is an error answer of the internal routes, in the public
// contract's shape: HandleForwarded's refusals use it too.
func ErrorBody(code, detail string) []byte {
	b, _ := json.Marshal(struct {
		Error  string `json:"error"`
		Detail string `json:"detail,omitempty"`
	}{code, detail})
	return append(b, '\n')
}

func writeError(ctx *fasthttp.RequestCtx, status int, code, detail string) {
	ctx.SetStatusCode(status)
	ctx.SetContentType(contentTypeJSON)
	ctx.SetBody(ErrorBody(code, detail))
}

func writeJSON(ctx *fasthttp.RequestCtx, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		writeError(ctx, fasthttp.StatusInternalServerError, "internal", "encode response")
		return
	}
	ctx.SetStatusCode(status)
	ctx.SetContentType(contentTypeJSON)
	ctx.SetBody(append(b, '\n'))
}
