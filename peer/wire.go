package peer

import (
	"errors"
	"time"

	"github.com/valyala/fasthttp"
)

// The wire of POST /internal/v1/propose (docs/architecture.md,
// "Forwarding inside the cluster"): the body is one command in the
// ledger's binary encoding, the answer one encoded result. MaxBodyBytes
// is its own cap, far above the largest Take batch, and independent of
// the public body cap.
const (
	// MaxBodyBytes bounds one forwarded command (and any body on the
	// internal routes).
	MaxBodyBytes = 4 << 20
	// WireVersion is sent in headerWireVersion; a node refuses a version
	// it does not speak (400), so mixed versions fail loudly.
	WireVersion        = "1"
	headerWireVersion  = "X-Stockd-Wire"
	contentTypeCommand = "application/x-stockd-command"
	contentTypeJSON    = "application/json"
)

// The routes the service answers.
const (
	// RoutePrefix is every internal route's: the HTTP server hands a
	// request under it to Service.Handle.
	RoutePrefix    = "/internal/v1/"
	routePropose   = RoutePrefix + "propose"
	routeStatus    = RoutePrefix + "status"
	routeReadIndex = RoutePrefix + "read-index"
	// argLease asks the read index route for the leader's lease instead
	// of a quorum round.
	argLease = "lease"
)

// Headers every node-to-node call carries.
const (
	// headerSecret carries the cluster secret (a cluster without node
	// certificates).
	headerSecret = "X-Stockd-Cluster-Secret"
	// headerNode names the calling node.
	headerNode = "X-Stockd-Node"
	// headerCluster carries a restored cluster's identity
	// (Config.ClusterID).
	headerCluster = "X-Stockd-Cluster"
)

// Statuses of the propose route beside 200 (the encoded result).
const (
	// ProposeNotLeader: this node does not lead; nothing was proposed.
	ProposeNotLeader = fasthttp.StatusMisdirectedRequest
	// ProposeUnavailable: the leader could not queue the command; nothing
	// was proposed.
	ProposeUnavailable = fasthttp.StatusServiceUnavailable
	// ProposeOutcomeUnknown: the command entered the log; it may commit.
	ProposeOutcomeUnknown = fasthttp.StatusGatewayTimeout
	// ProposeMalformed, ProposeForbidden and ProposeTooLarge: refused for
	// good (forbidden: not a command a peer may send, such as a Take in
	// another node's name).
	ProposeMalformed = fasthttp.StatusBadRequest
	ProposeForbidden = fasthttp.StatusForbidden
	ProposeTooLarge  = fasthttp.StatusRequestEntityTooLarge
)

// Timeouts of the calls the service makes or answers.
const (
	// readIndexWait bounds the leader's confirmation of a read index.
	readIndexWait = time.Second
	// connsMax bounds the connections this node opens to one peer.
	connsMax = 64
	// connWaitMax is how long a call waits for one of them to come free
	// before it fails as not sent: a burst of relayed calls (confirms
	// answered 50 ms after they apply) queues briefly instead of failing
	// at once. Shorter than every peer call's timeout, so a call that
	// never got a connection is always told apart from one that may have
	// reached the peer.
	connWaitMax = 500 * time.Millisecond
)

// ErrNotSent marks a peer call that surely did not reach the peer (the
// dial failed): it may be sent again.
var ErrNotSent = errors.New("not sent")

// readIndexJSON is GET /internal/v1/read-index's answer: an index every
// write the cluster acknowledged before the call has reached.
type readIndexJSON struct {
	Index uint64 `json:"index"`
}
