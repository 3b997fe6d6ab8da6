package eventloop

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"stockd.dev/stockd/engine"
	"stockd.dev/stockd/httpapi/deductwire"
)

// AsyncDeducter is an engine that answers a deduct without blocking its
// caller (engine.Engine.DeductAsync): done runs on the goroutine that
// settles it, unless the answer is known at once (true, res set).
type AsyncDeducter interface {
	DeductAsync(req *engine.DeductRequest, res *engine.DeductResult, done func(*engine.DeductResult)) bool
}

// Config is what the loop needs to serve deducts as the handlers serve
// them.
type Config struct {
	Engine AsyncDeducter
	// Credentials are the handlers' (httpapi.Server.Credentials).
	Credentials deductwire.Credentials
	// MaxConns bounds the connections the loop holds; past it, new ones
	// go to the fasthttp server, which applies its own limit.
	MaxConns int
	// The handlers' timeouts: a connection idle, part way through a
	// request, or not taking its answers past them is closed.
	ReadTimeout, WriteTimeout, IdleTimeout time.Duration
	Logger                                 *slog.Logger
	// Observe records a deduct's latency from its start (the handlers'
	// histogram, httpapi.Server.ObserveDeduct); nil: none.
	Observe func(start time.Time)
}

func (c *Config) validate() error {
	if c.Engine == nil {
		return errors.New("http event loop: no engine")
	}
	if c.MaxConns < 1 || c.ReadTimeout <= 0 || c.WriteTimeout <= 0 || c.IdleTimeout <= 0 {
		return fmt.Errorf("http event loop: max conns %d and timeouts (read %s, write %s, idle %s) must be > 0",
			c.MaxConns, c.ReadTimeout, c.WriteTimeout, c.IdleTimeout)
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}
