package raftfsm

import (
	"stockd.dev/stockd/internal/wire"
)

// ErrMalformed marks bytes that are not a valid command or result: a
// sender that gets it back must not send the same bytes again.
var ErrMalformed = wire.ErrMalformed
