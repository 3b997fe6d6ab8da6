package httpapi

import (
	"errors"
	"time"

	"github.com/valyala/fasthttp"
)

// Peers is what the HTTP layer needs of the node-to-node wire (peer's
// Client and Service implement it; node joins the two).
type Peers interface {
	// Do sends req (its URI a path) to node id with this node's
	// credentials; NotSent tells an error that surely did not reach it.
	Do(id string, req *fasthttp.Request, resp *fasthttp.Response, timeout time.Duration) error
	NotSent(err error) bool
	// Status reads node id's own ClusterStatus into out.
	Status(id string, timeout time.Duration, out any) error
	// FromPeer reports whether a request comes from another node of the
	// cluster (its certificate, or the cluster secret).
	FromPeer(ctx *fasthttp.RequestCtx) bool
}

// RouteInternal is the prefix of the routes Config.Internal serves.
var RouteInternal = []byte("/internal/")

// alone is the Peers of a node without a cluster (tests): no peer to
// call, none to hear.
type alone struct{}

var errAlone = errors.New("this node has no peers")

func (alone) Do(string, *fasthttp.Request, *fasthttp.Response, time.Duration) error { return errAlone }
func (alone) NotSent(error) bool                                                    { return true }
func (alone) Status(string, time.Duration, any) error                               { return errAlone }
func (alone) FromPeer(*fasthttp.RequestCtx) bool                                    { return false }
