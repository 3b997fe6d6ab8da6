//go:build !linux

package eventloop

import (
	"bytes"
	"context"
	"errors"
	"net"
)

// Available says whether Serve can run here: it needs Linux's epoll.
const Available = false

// Loop needs Linux's epoll.
type Loop struct{}

// Serve needs Linux's epoll.
func Serve(*net.TCPListener, Config) (*Loop, net.Listener, error) {
	return nil, nil, errors.New("http: the deduct event loop runs on Linux only")
}

// Shutdown does nothing: there is no loop.
func (*Loop) Shutdown(context.Context) error { return nil }

// WriteMetrics writes nothing: there is no loop.
func (*Loop) WriteMetrics(*bytes.Buffer) {}
