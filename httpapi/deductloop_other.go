//go:build !linux

package httpapi

import (
	"bytes"
	"context"
	"errors"
	"net"
)

// ServeDeductLoop needs Linux's epoll.
func (s *Server) ServeDeductLoop(*net.TCPListener) (net.Listener, error) {
	return nil, errors.New("http: the deduct event loop runs on Linux only")
}

type deductLoop struct{}

func (*deductLoop) shutdown(context.Context) error { return nil }

func (*deductLoop) writeMetrics(*bytes.Buffer) {}
