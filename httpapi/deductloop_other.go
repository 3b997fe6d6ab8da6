//go:build !linux

package httpapi

import (
	"bytes"
	"context"
	"errors"
	"net"
)

// DeductLoopAvailable says whether ServeDeductLoop can run here: it needs
// Linux's epoll.
const DeductLoopAvailable = false

// ServeDeductLoop needs Linux's epoll.
func (s *Server) ServeDeductLoop(*net.TCPListener) (net.Listener, error) {
	return nil, errors.New("http: the deduct event loop runs on Linux only")
}

type deductLoop struct{}

func (*deductLoop) shutdown(context.Context) error { return nil }

func (*deductLoop) writeMetrics(*bytes.Buffer) {}
