// Package lottery is what every node computes alike for a lottery sale
// (docs/feed-and-lottery.md, "Lottery sales"): the sale takes entries until
// entries_close_at, then the leader proposes a Draw and every node ranks
// the entries by the same documented function of the seed, the entries'
// hash and each entry's sequence number:
//
//	entries_hash_0 = 32 zero bytes
//	entries_hash_n = SHA-256(entries_hash_(n-1) || be32(len(user_n)) || user_n)
//	key(n)         = SHA-256(seed || entries_hash_N || be64(n))
//
// Entries sort by key (bytes, ascending; sequence on a tie); the first
// Available win orders, the rest wait in that order. The seed is drawn
// when the sale is created and only its SHA-256 is shown until the draw.
package lottery

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"slices"
	"strconv"
	"sync"

	bolt "go.etcd.io/bbolt"
	"stockd.dev/stockd/internal/wire"
	"stockd.dev/stockd/stock"
)

const (
	// SecretBytes is CreateSale.Secret of a lottery: a 32-byte seed
	// then a 16-byte key that makes winners' order ids unguessable (the
	// seed is revealed by the draw; the key never is).
	SecretBytes          = lotterySeedBytes + lotteryOrderKeyBytes
	lotterySeedBytes     = 32
	lotteryOrderKeyBytes = 16
	// MaxEntries bounds one lottery: its ranking costs 8 bytes an
	// entry in memory and its draw hashes and sorts every entry in one
	// Apply (about a second for a million on the reference machine).
	MaxEntries = 10_000_000
	// Node is Order.Node of a winner's order: the ledger made it.
	Node = "lottery"
)

// New is the lottery part of a new sale's row, from the secret its
// CreateSale carries.
func New(secret []byte) *stock.Lottery {
	seed := secret[:lotterySeedBytes]
	sum := sha256.Sum256(seed)
	return &stock.Lottery{
		Seed: slices.Clone(seed), OrderKey: slices.Clone(secret[lotterySeedBytes:]),
		SeedCommitment: sum[:], EntriesHash: make([]byte, sha256.Size),
	}
}

// EachEntry calls fn for every entry of lottery sku in b (the entries
// bucket), in sequence order, until fn returns an error.
func EachEntry(b *bolt.Bucket, sku string, fn func(*stock.Entry) error) error {
	prefix := append([]byte(sku), 0)
	cur := b.Cursor()
	for k, v := cur.Seek(prefix); k != nil && len(k) == len(prefix)+8 && string(k[:len(prefix)]) == string(prefix); k, v = cur.Next() {
		e, err := DecodeEntryRecord(sku, int64(binary.BigEndian.Uint64(k[len(prefix):])), v)
		if err != nil {
			return err
		}
		if err := fn(&e); err != nil {
			return err
		}
	}
	return nil
}

// NextEntriesHash chains user onto the entries hash h.
func NextEntriesHash(h []byte, user string) []byte {
	var buf [sha256.Size + 4 + maxNameBytes]byte
	b := append(buf[:0], h...)
	b = binary.BigEndian.AppendUint32(b, uint32(len(user)))
	b = append(b, user...)
	sum := sha256.Sum256(b)
	return sum[:]
}

func EntryKey(sku string, seq int64) []byte {
	k := make([]byte, 0, len(sku)+9)
	k = append(append(k, sku...), 0)
	return binary.BigEndian.AppendUint64(k, uint64(seq))
}

func EncodeEntryRecord(e *stock.Entry) []byte {
	b := make([]byte, 0, 4+len(e.User)+len(e.RequestID)+wire.MaxVarintBytes)
	b = wire.AppendString(wire.AppendString(b, e.User), e.RequestID)
	return wire.AppendVarint(b, e.AtUnixNano)
}

func DecodeEntryRecord(sku string, seq int64, b []byte) (stock.Entry, error) {
	d := wire.Decoder{B: b}
	e := stock.Entry{SKU: sku, Seq: seq, User: d.String(), RequestID: d.String(), AtUnixNano: d.Varint()}
	if err := d.Finish(); err != nil {
		return stock.Entry{}, fmt.Errorf("entry %d of %q: %w", seq, sku, err)
	}
	return e, nil
}

// OrderID is the order id of entry seq's win in lottery sku:
// unguessable without the sale's order key, the same on every node.
func OrderID(key []byte, sku string, seq int64) string {
	var buf [lotteryOrderKeyBytes + maxNameBytes + 8]byte
	b := append(append(buf[:0], key...), sku...)
	b = binary.BigEndian.AppendUint64(b, uint64(seq))
	sum := sha256.Sum256(b)
	return "L" + strconv.FormatInt(seq, 36) + ":" + hex.EncodeToString(sum[:10])
}

// Ranking is a drawn lottery's order: seqs[r] is the entry of rank r,
// rankOf[seq-1] the rank of entry seq.
type Ranking struct {
	seed, hash []byte
	entries    int64
	Seqs       []uint32
	RankOf     []uint32
}

// Rankings caches each lottery's ranking: a pure function of its
// seed, entries hash and entry count, which a drawn lottery never changes.
type Rankings struct {
	mu sync.Mutex
	m  map[string]*Ranking
}

// Get returns lottery sku's ranking, computing it on first use.
func (c *Rankings) Get(sku string, lt *stock.Lottery) *Ranking {
	c.mu.Lock()
	defer c.mu.Unlock()
	if r, ok := c.m[sku]; ok && r.entries == lt.Entries && slices.Equal(r.seed, lt.Seed) && slices.Equal(r.hash, lt.EntriesHash) {
		return r
	}
	r := Rank(lt.Seed, lt.EntriesHash, lt.Entries)
	if c.m == nil {
		c.m = map[string]*Ranking{}
	}
	// A bounded cache: a ranking dropped is computed again when needed.
	for name := range c.m {
		if len(c.m) < rankingsCachedMax {
			break
		}
		delete(c.m, name)
	}
	c.m[sku] = r
	return r
}

// rankingsCachedMax bounds the rankings kept in memory (8 bytes an entry
// each): the lotteries being read after their draws, in practice one or two.
const rankingsCachedMax = 8

// Forget drops a cached ranking (the sale's entries left).
func (c *Rankings) Forget(sku string) {
	c.mu.Lock()
	delete(c.m, sku)
	c.mu.Unlock()
}

// Rank ranks entries 1..n by key(n) (see the package's lottery
// comment). It sorts by the keys' first 8 bytes, 16 bytes an entry, and
// orders the rare runs that share them by their whole keys.
func Rank(seed, hash []byte, n int64) *Ranking {
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
func rankBy(n int64, key func(seq uint32) [sha256.Size]byte) *Ranking {
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
	r := &Ranking{entries: n, Seqs: make([]uint32, n), RankOf: make([]uint32, n)}
	for rank, k := range keys {
		r.Seqs[rank] = k.seq
		r.RankOf[k.seq-1] = uint32(rank)
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

// maxNameBytes is the room the hashes' stack buffers keep for a SKU or a
// user; a longer one (the HTTP layer refuses them) spills to the heap.
const maxNameBytes = 256
