package raftfsm

import (
	"encoding/binary"
	"fmt"
	"slices"
)

// requestChange is a request id's new record: its order and creation
// time, or (order "") its deletion.
type requestChange struct {
	order string
	at    int64
}

// requestCount is the number of request ids the ledger holds, this
// batch's changes included.
func (a *applier) requestCount() int64 {
	l := a.ledger
	l.mu.RLock()
	defer l.mu.RUnlock()
	return int64(l.requests.len()) + a.requestDelta
}

// maxKeyBytes bounds the SKU and user parts of a buyer key; longer ids are
// refused at the HTTP boundary well before this.
const maxKeyBytes = 256

// appendBuyerKey appends the buyers-bucket key of (sku, user).
func appendBuyerKey[T ~string | ~[]byte](dst []byte, sku, user T) []byte {
	dst = append(dst, sku...)
	dst = append(dst, 0)
	return append(dst, user...)
}

func (a *applier) addBought(sku, user string, delta int64) (int64, error) {
	k := appendBuyerKey(nil, sku, user)
	v, err := a.get(bucketBuyers, k)
	if err != nil {
		return 0, err
	}
	var n int64
	if len(v) == 8 {
		n = int64(binary.BigEndian.Uint64(v))
	}
	if delta == 0 {
		return n, nil
	}
	n += delta
	if n < 0 {
		panic(fmt.Sprintf("BUG: user %q bought %d of sku %q", user, n, sku))
	}
	a.boughtChanges[string(k)] = n
	if n == 0 {
		a.put(bucketBuyers, k, nil)
		return 0, nil
	}
	a.put(bucketBuyers, k, binary.BigEndian.AppendUint64(nil, uint64(n)))
	return n, nil
}

func (a *applier) requestOrder(requestID string) (string, bool, error) {
	if ch, ok := a.requestChanges[requestID]; ok {
		return ch.order, ch.order != "", nil
	}
	l := a.ledger
	l.mu.RLock()
	at, ok := l.requests.candidate([]byte(requestID))
	l.mu.RUnlock()
	if !ok {
		return "", false, nil
	}
	v, err := a.get(bucketRequestsByTime, requestTimeKey(at, requestID))
	if err != nil || v == nil {
		return "", false, err
	}
	return string(v), true, nil
}

func requestTimeKey(createdAtUnixNano int64, requestID string) []byte {
	k := make([]byte, 8, 8+len(requestID))
	binary.BigEndian.PutUint64(k, uint64(createdAtUnixNano))
	return append(k, requestID...)
}

func (a *applier) rememberRequest(requestID, orderID string, createdAtUnixNano int64) error {
	a.put(bucketRequestsByTime, requestTimeKey(createdAtUnixNano, requestID), []byte(orderID))
	a.requestChanges[requestID] = requestChange{order: orderID, at: createdAtUnixNano}
	a.requestDelta++
	return nil
}

// pruneRequests forgets request ids whose order was created before the
// command's cutoff, then the oldest ones beyond MaxKeep. The orders stay;
// a retry of a forgotten request id is judged as a new deduct.
func (a *applier) pruneRequests(c *PruneRequests) (*Result, error) {
	if c.MaxKeep < 0 {
		return invalid("prune_requests max_keep %d < 0", c.MaxKeep), nil
	}
	tx, err := a.readTx()
	if err != nil {
		return nil, err
	}
	count := a.requestCount()
	var doomed [][]byte
	ascend(tx, a.bh, a.batch[string(bucketRequestsByTime)], bucketRequestsByTime, func(k, _ []byte) bool {
		if len(k) < 8 {
			return true
		}
		created := int64(binary.BigEndian.Uint64(k[:8]))
		overCount := c.MaxKeep > 0 && count-int64(len(doomed)) > c.MaxKeep
		if created >= c.BeforeUnixNano && !overCount {
			return false
		}
		doomed = append(doomed, slices.Clone(k))
		return true
	})
	for _, k := range doomed {
		a.put(bucketRequestsByTime, k, nil)
		a.requestChanges[string(k[8:])] = requestChange{at: int64(binary.BigEndian.Uint64(k[:8]))}
		a.requestDelta--
	}
	return &Result{Outcome: OutcomeOK, Qty: int64(len(doomed))}, nil
}
