// Package loopport picks loopback ports for the processes a harness
// starts (the bench's launched nodes, the multi-process tests), which are
// told a port on their command line and bind it themselves a moment
// later. A port the kernel hands out for "127.0.0.1:0" lies in its
// ephemeral range, where the next outgoing connection of any process (a
// load client's, say) may take it as its local end before the node binds
// it; Free picks below that range instead, and never the same port twice
// in one process.
package loopport

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
)

const (
	// lowestPort is the lowest port Free picks: clear of the well-known
	// and the commonly configured ones.
	lowestPort = 10000
	// minSpanPorts is the fewest ports a range outside the ephemeral one
	// must offer to be used.
	minSpanPorts = 2000
	// attemptsMax bounds the ports tried before Free gives up.
	attemptsMax = 200
	// rangeFile is where Linux keeps its ephemeral range.
	rangeFile = "/proc/sys/net/ipv4/ip_local_port_range"
	// defaultEphemeralLow is Linux's default start of the range, taken
	// when the file cannot be read.
	defaultEphemeralLow, defaultEphemeralHigh = 32768, 60999
)

// ErrNoPort is returned when no port in the range could be bound.
var ErrNoPort = errors.New("no free loopback port outside the ephemeral range")

var handedOut struct {
	mu   sync.Mutex
	seen map[int]bool
}

// Free returns "127.0.0.1:PORT" for a port that nothing listened on
// when it was tried, outside the kernel's ephemeral range (when the range
// leaves room for one) and not returned before by this process. Another
// process may still bind it first; the caller's bind then fails with a
// clear error.
func Free() (string, error) {
	lo, hi := ephemeralRange()
	from, to, ok := span(lo, hi)
	handedOut.mu.Lock()
	defer handedOut.mu.Unlock()
	if handedOut.seen == nil {
		handedOut.seen = map[int]bool{}
	}
	for range attemptsMax {
		port := 0 // the kernel's pick, when no span is left outside its range
		if ok {
			port = from + rand.IntN(to-from+1)
		}
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			continue
		}
		port = ln.Addr().(*net.TCPAddr).Port
		ln.Close()
		if handedOut.seen[port] {
			continue
		}
		handedOut.seen[port] = true
		return ln.Addr().String(), nil
	}
	return "", fmt.Errorf("%w: %d ports tried in %d-%d", ErrNoPort, attemptsMax, from, to)
}

// ephemeralRange is the kernel's ephemeral port range, or Linux's default
// where it cannot be read.
func ephemeralRange() (lo, hi int) {
	b, err := os.ReadFile(rangeFile)
	if err != nil {
		return defaultEphemeralLow, defaultEphemeralHigh
	}
	if lo, hi, ok := parseRange(string(b)); ok {
		return lo, hi
	}
	return defaultEphemeralLow, defaultEphemeralHigh
}

// parseRange reads the two numbers of ip_local_port_range.
func parseRange(s string) (lo, hi int, ok bool) {
	f := strings.Fields(s)
	if len(f) != 2 {
		return 0, 0, false
	}
	lo, err1 := strconv.Atoi(f[0])
	hi, err2 := strconv.Atoi(f[1])
	if err1 != nil || err2 != nil || lo < 1 || hi > 65535 || lo > hi {
		return 0, 0, false
	}
	return lo, hi, true
}

// span is the range Free picks from, given the ephemeral range lo-hi:
// below it, else above it; ok is false when neither leaves minSpanPorts
// (Free then takes what the kernel gives).
func span(lo, hi int) (from, to int, ok bool) {
	switch {
	case lo-lowestPort >= minSpanPorts:
		return lowestPort, lo - 1, true
	case 65535-hi >= minSpanPorts:
		return hi + 1, 65535, true
	}
	return 0, 0, false
}
