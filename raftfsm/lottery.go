package raftfsm

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"slices"
	"stockd/internal/wire"
	"stockd/raftfsm/store"
	"stockd/stock"
	"strconv"
	"sync"

	bolt "go.etcd.io/bbolt"
)

// Lottery sales (docs/feed-and-lottery.md): the sale takes entries until
// entries_close_at, then the leader proposes a Draw and every node ranks
// the entries by the same documented function of the seed, the entries'
// hash and each entry's sequence number (docs/feed-and-lottery.md, "Lottery sales"):
//
//	entries_hash_0 = 32 zero bytes
//	entries_hash_n = SHA-256(entries_hash_(n-1) || be32(len(user_n)) || user_n)
//	key(n)         = SHA-256(seed || entries_hash_N || be64(n))
//
// Entries sort by key (bytes, ascending; sequence on a tie); the first
// Available win orders, the rest wait in that order. The seed is drawn
// when the sale is created and only its SHA-256 is shown until the draw.

const (
	// LotterySecretBytes is CreateSale.Secret of a lottery: a 32-byte seed
	// then a 16-byte key that makes winners' order ids unguessable (the
	// seed is revealed by the draw; the key never is).
	LotterySecretBytes   = lotterySeedBytes + lotteryOrderKeyBytes
	lotterySeedBytes     = 32
	lotteryOrderKeyBytes = 16
	// MaxLotteryEntries bounds one lottery: its ranking costs 8 bytes an
	// entry in memory and its draw hashes and sorts every entry in one
	// Apply (about a second for a million on the reference machine).
	MaxLotteryEntries = 10_000_000
	// lotteryNode is Order.Node of a winner's order: the ledger made it.
	lotteryNode = "lottery"
)

// EntryResult is the verdict on one EnterEntry: OutcomeOK (entered) or
// OutcomeSame (the user's entry exists; Entry is it).
type EntryResult struct {
	Outcome stock.Outcome
	Entry   stock.Entry
}

// newLottery is the lottery part of a new sale's row, from the secret its
// CreateSale carries.
func newLottery(secret []byte) *stock.Lottery {
	seed := secret[:lotterySeedBytes]
	sum := sha256.Sum256(seed)
	return &stock.Lottery{
		Seed: slices.Clone(seed), OrderKey: slices.Clone(secret[lotterySeedBytes:]),
		SeedCommitment: sum[:], EntriesHash: make([]byte, sha256.Size),
	}
}

// nextEntriesHash chains user onto the entries hash h.
func nextEntriesHash(h []byte, user string) []byte {
	var buf [sha256.Size + 4 + maxKeyBytes]byte
	b := append(buf[:0], h...)
	b = binary.BigEndian.AppendUint32(b, uint32(len(user)))
	b = append(b, user...)
	sum := sha256.Sum256(b)
	return sum[:]
}

func entryKey(sku string, seq int64) []byte {
	k := make([]byte, 0, len(sku)+9)
	k = append(append(k, sku...), 0)
	return binary.BigEndian.AppendUint64(k, uint64(seq))
}

func encodeEntryRecord(e *stock.Entry) []byte {
	b := make([]byte, 0, 4+len(e.User)+len(e.RequestID)+wire.MaxVarintBytes)
	b = wire.AppendString(wire.AppendString(b, e.User), e.RequestID)
	return wire.AppendVarint(b, e.AtUnixNano)
}

func decodeEntryRecord(sku string, seq int64, b []byte) (stock.Entry, error) {
	d := wire.Decoder{B: b}
	e := stock.Entry{SKU: sku, Seq: seq, User: d.String(), RequestID: d.String(), AtUnixNano: d.Varint()}
	if err := d.Finish(); err != nil {
		return stock.Entry{}, fmt.Errorf("entry %d of %q: %w", seq, sku, err)
	}
	return e, nil
}

// lotteryOrderID is the order id of entry seq's win in lottery sku:
// unguessable without the sale's order key, the same on every node.
func lotteryOrderID(key []byte, sku string, seq int64) string {
	var buf [lotteryOrderKeyBytes + maxKeyBytes + 8]byte
	b := append(append(buf[:0], key...), sku...)
	b = binary.BigEndian.AppendUint64(b, uint64(seq))
	sum := sha256.Sum256(b)
	return "L" + strconv.FormatInt(seq, 36) + ":" + hex.EncodeToString(sum[:10])
}

// ranking is a drawn lottery's order: seqs[r] is the entry of rank r,
// rankOf[seq-1] the rank of entry seq.
type ranking struct {
	seed, hash []byte
	entries    int64
	seqs       []uint32
	rankOf     []uint32
}

// lotteryRankings caches each lottery's ranking: a pure function of its
// seed, entries hash and entry count, which a drawn lottery never changes.
type lotteryRankings struct {
	mu sync.Mutex
	m  map[string]*ranking
}

// ranking returns lottery sku's ranking, computing it on first use.
func (l *Ledger) ranking(sku string, lt *stock.Lottery) *ranking {
	l.rankings.mu.Lock()
	defer l.rankings.mu.Unlock()
	if r, ok := l.rankings.m[sku]; ok && r.entries == lt.Entries && slices.Equal(r.seed, lt.Seed) && slices.Equal(r.hash, lt.EntriesHash) {
		return r
	}
	r := rankEntries(lt.Seed, lt.EntriesHash, lt.Entries)
	if l.rankings.m == nil {
		l.rankings.m = map[string]*ranking{}
	}
	// A bounded cache: a ranking dropped is computed again when needed.
	for name := range l.rankings.m {
		if len(l.rankings.m) < rankingsCachedMax {
			break
		}
		delete(l.rankings.m, name)
	}
	l.rankings.m[sku] = r
	return r
}

// rankingsCachedMax bounds the rankings kept in memory (8 bytes an entry
// each): the lotteries being read after their draws, in practice one or two.
const rankingsCachedMax = 8

// forgetRanking drops a cached ranking (the sale's entries left).
func (l *Ledger) forgetRanking(sku string) {
	l.rankings.mu.Lock()
	delete(l.rankings.m, sku)
	l.rankings.mu.Unlock()
}

// rankEntries ranks entries 1..n by key(n) (see the package's lottery
// comment). It sorts by the keys' first 8 bytes, 16 bytes an entry, and
// orders the rare runs that share them by their whole keys.
func rankEntries(seed, hash []byte, n int64) *ranking {
	var buf [2*sha256.Size + 8]byte
	b := append(append(buf[:0], seed...), hash...)
	prefix := len(b)
	b = b[:prefix+8]
	r := rankBy(n, func(seq uint32) [sha256.Size]byte {
		binary.BigEndian.PutUint64(b[prefix:], uint64(seq))
		return sha256.Sum256(b)
	})
	r.seed, r.hash = slices.Clone(seed), slices.Clone(hash)
	return r
}

// rankBy ranks entries 1..n by key (ascending, by seq on equal keys).
func rankBy(n int64, key func(seq uint32) [sha256.Size]byte) *ranking {
	type keyed struct {
		prefix uint64
		seq    uint32
	}
	keys := make([]keyed, n)
	for i := range keys {
		seq := uint32(i + 1)
		k := key(seq)
		keys[i] = keyed{prefix: binary.BigEndian.Uint64(k[:8]), seq: seq}
	}
	slices.SortFunc(keys, func(x, y keyed) int {
		if x.prefix != y.prefix {
			if x.prefix < y.prefix {
				return -1
			}
			return 1
		}
		return int(x.seq) - int(y.seq)
	})
	for i := 0; i < len(keys); {
		j := i + 1
		for j < len(keys) && keys[j].prefix == keys[i].prefix {
			j++
		}
		if j-i > 1 {
			slices.SortStableFunc(keys[i:j], func(x, y keyed) int {
				kx, ky := key(x.seq), key(y.seq)
				return compareKeys(&kx, &ky) // equal keys keep seq order
			})
		}
		i = j
	}
	r := &ranking{entries: n, seqs: make([]uint32, n), rankOf: make([]uint32, n)}
	for rank, k := range keys {
		r.seqs[rank] = k.seq
		r.rankOf[k.seq-1] = uint32(rank)
	}
	return r
}

func compareKeys(x, y *[sha256.Size]byte) int {
	for i := 0; i < sha256.Size; i += 8 {
		a, b := binary.BigEndian.Uint64(x[i:]), binary.BigEndian.Uint64(y[i:])
		if a != b {
			if a < b {
				return -1
			}
			return 1
		}
	}
	return 0
}

// EntryStatus reads user's entry into lottery sku: ok is false when the
// user has none (or sku is no lottery).
func (l *Ledger) EntryStatus(sku, user string) (stock.EntryStatus, bool, error) {
	row, _, ok := l.SKU(sku)
	if !ok || row.Lottery == nil {
		return stock.EntryStatus{}, false, nil
	}
	v, err := l.read(store.BucketEntryUsers, appendBuyerKey(nil, sku, user))
	if err != nil || v == nil {
		return stock.EntryStatus{}, false, err
	}
	if len(v) != 8 {
		return stock.EntryStatus{}, false, fmt.Errorf("%w: entry index of %q in %q", ErrMalformed, user, sku)
	}
	seq := int64(binary.BigEndian.Uint64(v))
	rec, err := l.read(store.BucketEntries, entryKey(sku, seq))
	if err != nil || rec == nil {
		return stock.EntryStatus{}, false, err
	}
	e, err := decodeEntryRecord(sku, seq, rec)
	if err != nil {
		return stock.EntryStatus{}, false, err
	}
	st := stock.EntryStatus{Entry: e, State: stock.EntryEntered}
	lt := row.Lottery
	if !lt.Drawn() {
		if row.Closed() {
			st.State = stock.EntryLost
		}
		return st, true, nil
	}
	if seq > lt.Entries {
		// Read between the entry's write and its row's: not yet
		// visible as drawn state (cannot happen after a draw).
		return st, true, nil
	}
	rank := int64(l.ranking(sku, lt).rankOf[seq-1])
	st.Rank = rank + 1
	switch {
	case rank < lt.Won():
		st.State, st.OrderID = stock.EntryWon, lotteryOrderID(lt.OrderKey, sku, seq)
	case lt.WaitlistLostAtUnixNano != 0:
		st.State = stock.EntryLost
	default:
		st.State, st.Position = stock.EntryWaitlisted, rank-lt.Won()+1
	}
	return st, true, nil
}

// SaleEntries calls fn for every committed entry of lottery sku in log
// order, from one consistent state of the ledger file, and returns the
// applied index that state reflects. It writes pending changes first.
func (l *Ledger) SaleEntries(sku string, fn func(*stock.Entry) error) (uint64, error) {
	if err := l.Flush(); err != nil {
		return 0, err
	}
	var applied uint64
	err := l.view(func(tx *bolt.Tx) error {
		applied = store.AppliedIn(tx)
		prefix := append([]byte(sku), 0)
		cur := tx.Bucket(store.BucketEntries).Cursor()
		for k, v := cur.Seek(prefix); k != nil && len(k) == len(prefix)+8 && string(k[:len(prefix)]) == string(prefix); k, v = cur.Next() {
			e, err := decodeEntryRecord(sku, int64(binary.BigEndian.Uint64(k[len(prefix):])), v)
			if err != nil {
				return err
			}
			if err := fn(&e); err != nil {
				return err
			}
		}
		return nil
	})
	return applied, err
}
