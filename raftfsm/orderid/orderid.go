// Package orderid is the format of the order ids stockd mints,
// "<node>-<sequence>-<random>": the minting node's id, a sequence that
// never repeats on that node, and 64 random bits, both numbers in base 36.
// The engine mints them (Minter), the ledger parses them (its order blocks
// are keyed by node and sequence, and a purge step names orders by those
// parts), and a node asks which node minted one (Owner) to read an order
// still pending there. It imports nothing of ours.
package orderid

import (
	crand "crypto/rand"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
)

// ID is an order id of the engine's shape, split.
type ID struct {
	Node    string // the node that minted it
	SeqText string // the sequence as written
	Random  string // the random part as written
	Seq     uint64
}

// Parse splits id; ok is false for an id of another shape (the ledger
// takes any id a caller gives it).
func Parse(id string) (p ID, ok bool) {
	last := strings.LastIndexByte(id, '-')
	if last <= 0 || last == len(id)-1 {
		return ID{}, false
	}
	prev := strings.LastIndexByte(id[:last], '-')
	if prev <= 0 || prev == last-1 {
		return ID{}, false
	}
	seq, err := strconv.ParseUint(id[prev+1:last], 36, 64)
	if err != nil {
		return ID{}, false
	}
	return ID{Node: id[:prev], SeqText: id[prev+1 : last], Random: id[last+1:], Seq: seq}, true
}

// CanonicalSeq reports whether the sequence is written as Minter writes
// it (no leading zero, lower case), so that the id can be rebuilt from
// the node and the number.
func (p *ID) CanonicalSeq() bool {
	var buf [16]byte
	return string(strconv.AppendUint(buf[:0], p.Seq, 36)) == p.SeqText
}

// RandomNumber is the random part as a number, when it is written as
// Minter writes it.
func (p *ID) RandomNumber() (uint64, bool) {
	n, err := strconv.ParseUint(p.Random, 36, 64)
	if err != nil || strconv.FormatUint(n, 36) != p.Random {
		return 0, false
	}
	return n, true
}

// Format writes the id of node, seq and random as Minter does.
func Format(node string, seq, random uint64) string {
	return string(appendID(make([]byte, 0, len(node)+28), node, seq, random))
}

func appendID(b []byte, node string, seq, random uint64) []byte {
	b = append(b, node...)
	b = append(b, '-')
	b = strconv.AppendUint(b, seq, 36)
	b = append(b, '-')
	return strconv.AppendUint(b, random, 36)
}

// Owner is the id of the node that minted order id, or "" for an id of
// another shape.
func Owner(id string) string {
	p, ok := Parse(id)
	if !ok {
		return ""
	}
	return p.Node
}

// Minter mints a node's order ids: a sequence that starts at the boot time
// in microseconds (far above any earlier run's) and 64 bits from a ChaCha8
// stream seeded from the operating system's random source, so that an
// order id does not reveal its neighbours (it is not a credential to
// guess). Only winners mint one; a mutex around the stream costs them
// nothing they would notice.
type Minter struct {
	node string
	mu   sync.Mutex
	seq  uint64
	rng  *rand.ChaCha8
}

// NewMinter returns node's minter; its first id has sequence startSeq+1.
func NewMinter(node string, startSeq uint64) *Minter {
	var seed [32]byte
	if _, err := crand.Read(seed[:]); err != nil {
		panic("BUG: the operating system's random source failed: " + err.Error())
	}
	return &Minter{node: node, seq: startSeq, rng: rand.NewChaCha8(seed)}
}

// Next returns a new order id. Safe for concurrent use.
func (m *Minter) Next() string {
	m.mu.Lock()
	m.seq++
	seq, unguessable := m.seq, m.rng.Uint64()
	m.mu.Unlock()
	return string(appendID(make([]byte, 0, len(m.node)+28), m.node, seq, unguessable))
}
