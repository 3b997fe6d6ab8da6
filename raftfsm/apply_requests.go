package raftfsm

import (
	"encoding/binary"
	"fmt"
	"slices"
	"stockd.dev/stockd/internal/wire"
	"stockd.dev/stockd/raftfsm/command"
	"stockd.dev/stockd/raftfsm/store"
	"stockd.dev/stockd/stock"
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
	return int64(l.requests.Len()) + a.requestDelta
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
	v, err := a.get(store.BucketBuyers, k)
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
		a.put(store.BucketBuyers, k, nil)
		return 0, nil
	}
	a.put(store.BucketBuyers, k, binary.BigEndian.AppendUint64(nil, uint64(n)))
	return n, nil
}

func (a *applier) requestOrder(requestID string) (string, bool, error) {
	if ch, ok := a.requestChanges[requestID]; ok {
		return ch.order, ch.order != "", nil
	}
	l := a.ledger
	l.mu.RLock()
	at, ok := l.requests.CandidateString(requestID)
	l.mu.RUnlock()
	if !ok {
		return "", false, nil
	}
	return findRequest(func(key []byte, fn func([]byte) error) error {
		v, err := a.get(store.BucketRequestsByTime, key)
		if err != nil {
			return err
		}
		return fn(v)
	}, at, requestID)
}

// requestPrior is what the ledger holds for a user's request id, as the
// entry being applied judges it: the key the id is (or would be) held
// under, and the order it produced or the lottery its entry went to
// (neither: a new request).
type requestPrior struct {
	key      string
	order    *stock.Order
	entrySKU string
}

// priorRequest looks user's request id up under the ledger's rules. Under
// RulesGlobalRequestIDs the id is the key, whoever sent it. Under
// RulesScopedRequestIDs it is the user's scoped key, and then the bare id
// of a record the earlier rules wrote, which counts only if its order is
// this user's: a repeat of an id recorded before the switch still gets its
// answer, and another user's id is another request.
func (a *applier) priorRequest(user, requestID string) (requestPrior, error) {
	if a.rules < RulesScopedRequestIDs {
		p := requestPrior{key: requestID}
		id, ok, err := a.requestOrder(requestID)
		if err != nil || !ok {
			return p, err
		}
		p.order, err = a.mustOrderOfRequest(requestID, id)
		return p, err
	}
	p := requestPrior{key: requestKey(user, requestID)}
	v, ok, err := a.requestOrder(p.key)
	if err != nil {
		return p, err
	}
	if ok {
		if sku, isEntry := entryOfRequestValue(v); isEntry {
			p.entrySKU = sku
			return p, nil
		}
		p.order, err = a.mustOrderOfRequest(p.key, v)
		return p, err
	}
	// A record of the earlier rules, if the ledger may hold any. The
	// count behind legacyRequests is never below the records the ledger
	// holds (requestIndex.legacy), so when it says none there is none to
	// find: skipping the lookup gives the answer it would have given, on
	// every node alike.
	if !a.legacyAdded && !a.ledger.legacyRequests.Load() {
		return p, nil
	}
	id, ok, err := a.requestOrder(requestID)
	if err != nil || !ok {
		return p, err
	}
	o, err := a.mustOrderOfRequest(requestID, id)
	if err != nil || o.User != user {
		return p, err
	}
	p.order = o
	return p, nil
}

func (a *applier) mustOrderOfRequest(key, id string) (*stock.Order, error) {
	o, err := a.getOrder(id)
	if err != nil {
		return nil, err
	}
	if o == nil {
		panic(fmt.Sprintf("BUG: request %q names missing order %q", key, id))
	}
	return o, nil
}

// forgetOrderRequest forgets the request id of order o (taken out by an
// archive), under whichever key the rules of its take held it.
func (a *applier) forgetOrderRequest(o *stock.Order) error {
	for _, key := range []string{requestKey(o.User, o.RequestID), o.RequestID} {
		if forgot, err := a.forgetRequestKey(o.CreatedAtUnixNano, key, o.ID); err != nil || forgot {
			return err
		}
	}
	// A record of the earlier file format, if it is still there.
	tk := requestTimeKey(o.CreatedAtUnixNano, o.RequestID)
	v, err := a.get(store.BucketRequestsByTime, tk)
	if err != nil {
		return err
	}
	if string(v) == o.ID {
		a.put(store.BucketRequestsByTime, tk, nil)
		a.requestChanges[o.RequestID] = requestChange{at: o.CreatedAtUnixNano}
		a.requestDelta--
	}
	return nil
}

// The requests_by_time bucket holds, for the orders created by one log
// entry, a request group: keyed by the entry's time alone (8 bytes,
// big-endian), the request ids and their order ids. A Take of a hundred
// buyers costs one record, not a hundred. Versions before groups wrote a
// record for each request id, keyed by the time and then the id, whose
// value is the order id; those are read, pruned and archived as they are.
// Two entries of one time share a group.
const requestGroupFormat byte = 0xA1

// requestPair is one member of a request group.
type requestPair struct{ request, order string }

// requestGroupKey is the key of the group of orders created at at.
func requestGroupKey(at int64) []byte {
	return binary.BigEndian.AppendUint64(make([]byte, 0, 8), uint64(at))
}

func encodeRequestGroup(pairs []requestPair) []byte {
	n := 1 + wire.MaxVarintBytes
	for _, p := range pairs {
		n += 2*wire.MaxVarintBytes + len(p.request) + len(p.order)
	}
	b := append(make([]byte, 0, n), requestGroupFormat)
	b = wire.AppendUvarint(b, uint64(len(pairs)))
	for _, p := range pairs {
		b = wire.AppendString(wire.AppendString(b, p.request), p.order)
	}
	return b
}

func decodeRequestGroup(b []byte) ([]requestPair, error) {
	if len(b) == 0 || b[0] != requestGroupFormat {
		return nil, fmt.Errorf("%w: not a request group", ErrMalformed)
	}
	// The group's ids share one allocation instead of two each: a prune
	// decodes every group it forgets. What keeps a group's ids beyond the
	// batch that read it is the index's exact map, which copies the one it
	// keeps (requestIndex.add).
	d := wire.Decoder{B: b[1:]}
	pairs := make([]requestPair, d.Count(2))
	ids := make([]string, 2*len(pairs))
	d.Strings(ids)
	for i := range pairs {
		pairs[i] = requestPair{ids[2*i], ids[2*i+1]}
	}
	if err := d.Finish(); err != nil {
		return nil, fmt.Errorf("request group: %w", err)
	}
	return pairs, nil
}

// findRequest looks request id up among the records of orders created
// at at, read through get (which calls fn with a key's value, nil when
// absent, valid during the call: a group is not copied to be searched):
// its group, then a record of the earlier format.
func findRequest(get func(key []byte, fn func(v []byte) error) error, at int64, requestID string) (string, bool, error) {
	var id string
	var found bool
	err := get(requestGroupKey(at), func(v []byte) error {
		if v == nil {
			return nil
		}
		var err error
		id, found, err = findInRequestGroup(v, requestID)
		return err
	})
	if err != nil || found {
		return id, found, err
	}
	err = get(requestTimeKey(at, requestID), func(v []byte) error {
		if v != nil {
			id, found = string(v), true
		}
		return nil
	})
	return id, found, err
}

// findInRequestGroup scans group v for request id, without decoding the
// members it passes.
func findInRequestGroup(v []byte, requestID string) (string, bool, error) {
	if len(v) == 0 || v[0] != requestGroupFormat {
		return "", false, fmt.Errorf("%w: not a request group", ErrMalformed)
	}
	d := wire.Decoder{B: v[1:]}
	n := d.Count(2)
	for i := 0; i < n && d.Err == nil; i++ {
		req := d.Bytes()
		order := d.Bytes()
		if string(req) == requestID && d.Err == nil {
			return string(order), true, nil
		}
	}
	return "", false, d.Err
}

func requestTimeKey(createdAtUnixNano int64, requestID string) []byte {
	k := make([]byte, 8, 8+len(requestID))
	binary.BigEndian.PutUint64(k, uint64(createdAtUnixNano))
	return append(k, requestID...)
}

// rememberRequest records that requestID produced orderID, created at
// createdAtUnixNano: in the mirrors at once, in the file with the rest of
// the entry's group (flushRequestGroup).
func (a *applier) rememberRequest(requestID, orderID string, createdAtUnixNano int64) {
	if isLegacyRequestKey(requestID) {
		a.legacyAdded = true
	}
	a.requestChanges[requestID] = requestChange{order: orderID, at: createdAtUnixNano}
	a.requestDelta++
	a.newRequests = append(a.newRequests, requestPair{requestID, orderID})
}

// requestGroup reads the group of orders created at at (none: nil).
func (a *applier) requestGroup(at int64) ([]requestPair, error) {
	if pairs, ok := a.groups[at]; ok {
		return pairs, nil
	}
	if uint64(at) > a.ledger.requestGroupsAtMax {
		return nil, nil // newer than every group written
	}
	v, err := a.get(store.BucketRequestsByTime, requestGroupKey(at))
	if err != nil || v == nil {
		return nil, err
	}
	pairs, err := decodeRequestGroup(v)
	if err == nil && a.groups != nil {
		a.groups[at] = pairs
	}
	return pairs, err
}

// holdRequestGroups keeps the request groups read and changed, decoded,
// until writeRequestGroups: an archive's purge forgets thousands of ids
// of the same few groups, which would otherwise be decoded and encoded
// again for each.
func (a *applier) holdRequestGroups() { a.groups = map[int64][]requestPair{} }

// writeRequestGroups writes the groups held since holdRequestGroups.
func (a *applier) writeRequestGroups() {
	held := a.groups
	a.groups = nil
	for at, pairs := range held {
		if a.groupsChanged[at] {
			a.putRequestGroup(at, pairs)
		}
	}
	clear(a.groupsChanged)
}

// putRequestGroup writes the group of orders created at at; an empty one
// is deleted.
func (a *applier) putRequestGroup(at int64, pairs []requestPair) {
	if a.groups != nil {
		a.groups[at] = pairs
		if a.groupsChanged == nil {
			a.groupsChanged = map[int64]bool{}
		}
		a.groupsChanged[at] = true
		return
	}
	var v []byte
	if len(pairs) > 0 {
		v = encodeRequestGroup(pairs)
	}
	a.ledger.requestGroupsAtMax = max(a.ledger.requestGroupsAtMax, uint64(at))
	a.put(store.BucketRequestsByTime, requestGroupKey(at), v)
}

// flushRequestGroup writes the request ids the entry being applied
// remembered as the group of its time, after any members the group has.
func (a *applier) flushRequestGroup() error {
	if len(a.newRequests) == 0 {
		return nil
	}
	had, err := a.requestGroup(a.at)
	if err != nil {
		return err
	}
	a.putRequestGroup(a.at, append(had, a.newRequests...))
	a.newRequests = a.newRequests[:0]
	return nil
}

// forgetRequestKey forgets request key, held for value in the group of
// time at, if the group holds it: in the file and in the mirrors.
func (a *applier) forgetRequestKey(at int64, key, value string) (bool, error) {
	forgot, err := a.forgetRequestInGroup(at, key, value)
	if err != nil || !forgot {
		return false, err
	}
	a.requestChanges[key] = requestChange{at: at}
	a.requestDelta--
	return true, nil
}

// forgetRequestInGroup takes request id (whose order is orderID) out of
// the group of orders created at at, if the group holds it.
func (a *applier) forgetRequestInGroup(at int64, requestID, orderID string) (bool, error) {
	pairs, err := a.requestGroup(at)
	if err != nil {
		return false, err
	}
	i := slices.IndexFunc(pairs, func(p requestPair) bool { return p.request == requestID && p.order == orderID })
	if i < 0 {
		return false, nil
	}
	a.putRequestGroup(at, slices.Delete(pairs, i, i+1))
	return true, nil
}

// prunedRequest is a request id a prune forgot, and when its order was
// created (its group's time).
type prunedRequest struct {
	request string
	at      int64
}

// forgetPruned takes a request id a prune forgets out of the index on
// publish. An id this very batch added is not in the index yet: its
// staged addition is dropped instead, so that the index never holds an
// id whose record is gone (the index's count decides how many a later
// prune forgets, and a restart rebuilds it from the records).
func (a *applier) forgetPruned(requestID string, at int64) {
	if len(a.requestChanges) > 0 {
		if ch, ok := a.requestChanges[requestID]; ok && ch.order != "" && ch.at == at {
			delete(a.requestChanges, requestID)
			return
		}
	}
	a.prunedRequests = append(a.prunedRequests, prunedRequest{request: requestID, at: at})
}

// pruneRequests forgets request ids whose order was created before the
// command's cutoff, then the oldest ones beyond MaxKeep. The orders stay;
// a retry of a forgotten request id is judged as a new deduct.
func (a *applier) pruneRequests(c *command.PruneRequests) (*command.Result, error) {
	if c.MaxKeep < 0 {
		return invalid("prune_requests max_keep %d < 0", c.MaxKeep), nil
	}
	tx, err := a.readTx()
	if err != nil {
		return nil, err
	}
	count := a.requestCount()
	var doomed [][]byte // records of the earlier format
	type groupChange struct {
		at   int64
		left []requestPair // empty: the whole group goes
	}
	var groups []groupChange
	forgotten := int64(0)
	var decodeErr error
	store.Ascend(tx, a.bh, a.batch[string(store.BucketRequestsByTime)], store.BucketRequestsByTime, func(k, v []byte) bool {
		if len(k) < 8 {
			return true
		}
		created := int64(binary.BigEndian.Uint64(k[:8]))
		doom := func() bool {
			overCount := c.MaxKeep > 0 && count-forgotten > c.MaxKeep
			return created < c.BeforeUnixNano || overCount
		}
		if len(k) > 8 {
			if !doom() {
				return false
			}
			doomed = append(doomed, slices.Clone(k))
			forgotten++
			return true
		}
		pairs, err := decodeRequestGroup(v)
		if err != nil {
			decodeErr = err
			return false
		}
		i := 0
		for ; i < len(pairs) && doom(); i++ {
			a.forgetPruned(pairs[i].request, created)
			forgotten++
		}
		if i == 0 {
			return false
		}
		groups = append(groups, groupChange{at: created, left: pairs[i:]})
		return i == len(pairs)
	})
	if decodeErr != nil {
		return nil, decodeErr
	}
	for _, k := range doomed {
		a.put(store.BucketRequestsByTime, k, nil)
		a.requestChanges[string(k[8:])] = requestChange{at: int64(binary.BigEndian.Uint64(k[:8]))}
	}
	for _, g := range groups {
		a.putRequestGroup(g.at, g.left)
	}
	a.requestDelta -= forgotten
	return &command.Result{Outcome: stock.OutcomeOK, Qty: forgotten}, nil
}
