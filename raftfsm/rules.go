package raftfsm

import (
	"encoding/binary"
	"fmt"
	"stockd.dev/stockd/internal/wire"
	"stockd.dev/stockd/raftfsm/command"
	"stockd.dev/stockd/raftfsm/store"
	"stockd.dev/stockd/stock"
)

// Ledger rules say how the ledger judges what it applies. A new rule is
// switched on through the log (SetRules), so every node applies each entry
// under the same rules whatever binary it runs: the entries before the
// switch under the old rules, the ones after it under the new. The leader
// proposes the switch only once every voter says it runs a binary that
// knows the rule (engine, "upgradeRules"); a binary that meets rules newer
// than its own stops rather than apply them wrongly.
const (
	// RulesGlobalRequestIDs is the ledger of versions before rules: a
	// request id names one order whoever sends it, and a repeat gets that
	// order whatever its SKU and qty.
	RulesGlobalRequestIDs uint64 = 0
	// RulesScopedRequestIDs scopes request ids to their user (the same id
	// from another user is another request), shares one id space per user
	// between deducts and lottery entries, and refuses a repeat with
	// another SKU or qty (OutcomeRequestIDReused).
	RulesScopedRequestIDs uint64 = 1
	// RulesNamedPurges: an archived sale's orders leave the ledger in
	// PurgeOrders steps that name the orders they remove, so every node
	// removes the same whatever its file's format; the PurgeArchived steps
	// of earlier rules, which walk the file, are refused.
	RulesNamedPurges uint64 = 2
	// RulesEmptyDrawCloses: a lottery drawn with no entries closes, its
	// units available, as a closed sale reads; under earlier rules it
	// stayed open while every deduct was answered lottery_sale.
	RulesEmptyDrawCloses uint64 = 3
	// RulesWaitingRoom: sales behind a waiting room (raftfsm/waitroom),
	// their commands and queued takes.
	RulesWaitingRoom uint64 = 4
	// RulesForwardAcks: a consumer's acknowledgement may be forward-only
	// (AckConsumer.Forward), which a service credential may send: it moves
	// a registered consumer ahead and never back.
	RulesForwardAcks uint64 = 5
	// RulesCurrent is the newest rules this binary applies.
	RulesCurrent = RulesForwardAcks
)

// keyRules holds the ledger's rules in the meta bucket (big-endian
// uint64; absent: RulesGlobalRequestIDs).
var keyRules = []byte("rules")

func (a *applier) setRules(c *command.SetRules) *command.Result {
	if c.Rules > RulesCurrent {
		// Applying the entries after it under rules this binary does not
		// know would make this node disagree with the others.
		panic(fmt.Sprintf("ledger rules %d are newer than this binary's (%d): run a newer stockd on this node", c.Rules, RulesCurrent))
	}
	if c.Rules <= a.rules {
		return &command.Result{Outcome: stock.OutcomeSame, Qty: int64(a.rules)}
	}
	a.rules = c.Rules
	a.put(store.BucketMeta, keyRules, binary.BigEndian.AppendUint64(nil, c.Rules))
	return &command.Result{Outcome: stock.OutcomeOK, Qty: int64(c.Rules)}
}

// Rules returns the rules the ledger applies entries under now. Safe for
// concurrent use.
func (l *Ledger) Rules() uint64 {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.rules
}

// loadRules reads the file's rules from its meta bucket.
func loadRules(meta []byte) (uint64, error) {
	switch len(meta) {
	case 0:
		return RulesGlobalRequestIDs, nil
	case 8:
		return binary.BigEndian.Uint64(meta), nil
	}
	return 0, fmt.Errorf("%w: rules record of %d bytes", ErrMalformed, len(meta))
}

// The request keys of RulesScopedRequestIDs: 0x00, the user's length as a
// uvarint, the user, the request id. Under the earlier rules the key was
// the request id as it is; the HTTP layer takes only printable ids, so no
// such key starts with 0x00 and both kinds live in one index. A request
// key names an order, or (requestEntryPrefix) the user's lottery entry.
const requestKeyPrefix = 0x00

// maxRequestKeyBytes bounds the key of ids within maxKeyBytes: callers
// build keys of such ids in a buffer of this size without allocating.
const maxRequestKeyBytes = 1 + wire.MaxVarintBytes + 2*maxKeyBytes

// MaxRequestKeyBytes is maxRequestKeyBytes, for the engine's buffers.
const MaxRequestKeyBytes = maxRequestKeyBytes

// AppendRequestKey appends the scoped key of user's request id: one key a
// user and an id, which no other pair shares. The engine keys its own
// pending attempts with it. Safe for concurrent use.
func AppendRequestKey(dst, user, requestID []byte) []byte {
	return appendRequestKey(dst, user, requestID)
}

// appendRequestKey appends the scoped key of user's request id.
func appendRequestKey[T ~string | ~[]byte](dst []byte, user, requestID T) []byte {
	dst = append(dst, requestKeyPrefix)
	dst = wire.AppendUvarint(dst, uint64(len(user)))
	dst = append(dst, user...)
	return append(dst, requestID...)
}

// requestKey is appendRequestKey into a new string (one allocation for
// ids within maxKeyBytes).
func requestKey(user, requestID string) string {
	var buf [maxRequestKeyBytes]byte
	return string(appendRequestKey(buf[:0], user, requestID))
}

// isLegacyRequestKey reports whether key is a request id held as it is
// (the rules before RulesScopedRequestIDs).
func isLegacyRequestKey(key string) bool { return len(key) == 0 || key[0] != requestKeyPrefix }

// requestEntryPrefix starts the value a request key holds for a lottery
// entry (instead of an order id): the prefix, then the lottery's SKU. No
// order id starts with it (take refuses such ids).
const requestEntryPrefix = "\x00E"

func requestEntryValue(sku string) string { return requestEntryPrefix + sku }

// entryOfRequestValue returns the lottery SKU of a request key's value
// that names an entry.
func entryOfRequestValue(v string) (sku string, ok bool) {
	if len(v) < len(requestEntryPrefix) || v[:len(requestEntryPrefix)] != requestEntryPrefix {
		return "", false
	}
	return v[len(requestEntryPrefix):], true
}
