package engine

import (
	crand "crypto/rand"
	"math/rand/v2"
	"strconv"
	"sync"
)

// orderIDs mints order ids: the node id, a sequence that never repeats on
// this node (it starts at the boot time in microseconds, far above any
// earlier run's), and 64 bits from a ChaCha8 stream seeded from the
// operating system's random source, so that one order id does not reveal
// its neighbours: an order id is not a credential to guess. Only winners
// mint one; a mutex around the stream costs them nothing they would notice.
type orderIDs struct {
	prefix string
	mu     sync.Mutex
	seq    uint64
	rng    *rand.ChaCha8
}

func newOrderIDs(nodeID string, startSeq uint64) *orderIDs {
	var seed [32]byte
	if _, err := crand.Read(seed[:]); err != nil {
		panic("BUG: the operating system's random source failed: " + err.Error())
	}
	return &orderIDs{prefix: nodeID + "-", seq: startSeq, rng: rand.NewChaCha8(seed)}
}

// next returns a new order id. Safe for concurrent use.
func (o *orderIDs) next() string {
	o.mu.Lock()
	o.seq++
	seq, unguessable := o.seq, o.rng.Uint64()
	o.mu.Unlock()
	b := make([]byte, 0, len(o.prefix)+13+1+13)
	b = append(b, o.prefix...)
	b = strconv.AppendUint(b, seq, 36)
	b = append(b, '-')
	b = strconv.AppendUint(b, unguessable, 36)
	return string(b)
}
