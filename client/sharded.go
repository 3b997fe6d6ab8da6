package client

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"sort"
)

// Sharded spreads SKUs over several stockd clusters, each a normal
// cluster that needs no other to sell: writes past one raft group. Each
// SKU belongs to one cluster, chosen by rendezvous hashing of the SKU, so
// adding a cluster moves only the SKUs it now wins.
//
// The function, for a client in another language to route alike: for
// every cluster, score = the first 8 bytes, big-endian, of SHA-256 over
// the bytes of the cluster's Name, one 0x00 byte, and the SKU's bytes;
// the SKU belongs to the cluster with the highest score (a tie goes to the
// name that sorts first, bytewise). (FNV-1a, tried first, sent ten SKUs of
// one prefix all to one of two clusters: a suffix shared by both inputs
// keeps their order.)
//
// Safe for concurrent use.
type Sharded struct {
	names    []string
	clusters []*Client
}

// NewSharded returns a client of the clusters cfgs describe; each needs a
// Name, unique among them, that stays the same for the cluster's life.
func NewSharded(cfgs []Config) (*Sharded, error) {
	if len(cfgs) == 0 {
		return nil, errors.New("client: NewSharded needs at least one cluster")
	}
	s := &Sharded{}
	seen := map[string]bool{}
	for _, cfg := range cfgs {
		if cfg.Name == "" || seen[cfg.Name] {
			s.Close()
			return nil, fmt.Errorf("client: every sharded cluster needs a Name of its own (got %q)", cfg.Name)
		}
		seen[cfg.Name] = true
		c, err := New(cfg)
		if err != nil {
			s.Close()
			return nil, fmt.Errorf("cluster %q: %w", cfg.Name, err)
		}
		s.names = append(s.names, cfg.Name)
		s.clusters = append(s.clusters, c)
	}
	return s, nil
}

// Close closes every cluster's client.
func (s *Sharded) Close() error {
	for _, c := range s.clusters {
		c.Close()
	}
	return nil
}

// ShardScore is the rendezvous score of sku on the cluster named name.
func ShardScore(name, sku string) uint64 {
	h := sha256.New()
	h.Write([]byte(name))
	h.Write([]byte{0})
	h.Write([]byte(sku))
	var sum [sha256.Size]byte
	return binary.BigEndian.Uint64(h.Sum(sum[:0]))
}

// ClusterOf returns the Name of the cluster that sells sku.
func (s *Sharded) ClusterOf(sku string) string { return s.names[s.shard(sku)] }

func (s *Sharded) shard(sku string) int {
	best := 0
	for i := 1; i < len(s.names); i++ {
		a, b := ShardScore(s.names[i], sku), ShardScore(s.names[best], sku)
		if a > b || a == b && s.names[i] < s.names[best] {
			best = i
		}
	}
	return best
}

// Cluster returns the client of the cluster that sells sku.
func (s *Sharded) Cluster(sku string) *Client { return s.clusters[s.shard(sku)] }

// Deduct is Client.Deduct on the SKU's cluster.
func (s *Sharded) Deduct(ctx context.Context, d Deduct) (Order, error) {
	return s.Cluster(d.SKU).Deduct(ctx, d)
}

// DeductBatch splits ds per cluster, runs the parts at once and returns
// the results in ds's order.
func (s *Sharded) DeductBatch(ctx context.Context, ds []Deduct) []Result {
	parts := map[int][]int{}
	for i := range ds {
		k := s.shard(ds[i].SKU)
		parts[k] = append(parts[k], i)
	}
	out := make([]Result, len(ds))
	done := make(chan struct{}, len(parts))
	keys := make([]int, 0, len(parts))
	for k := range parts {
		keys = append(keys, k)
	}
	sort.Ints(keys)
	for _, k := range keys {
		go func(k int, idx []int) {
			defer func() { done <- struct{}{} }()
			part := make([]Deduct, len(idx))
			for j, i := range idx {
				part[j] = ds[i]
			}
			for j, r := range s.clusters[k].DeductBatch(ctx, part) {
				out[idx[j]] = r
			}
		}(k, parts[k])
	}
	for range keys {
		<-done
	}
	return out
}

// SKU is Client.SKU on the SKU's cluster.
func (s *Sharded) SKU(ctx context.Context, sku string) (Sale, error) {
	return s.Cluster(sku).SKU(ctx, sku)
}

// CreateSale is Client.CreateSale on the SKU's cluster.
func (s *Sharded) CreateSale(ctx context.Context, sku string, cfg SaleConfig) (Sale, error) {
	return s.Cluster(sku).CreateSale(ctx, sku, cfg)
}

// CloseSale is Client.CloseSale on the SKU's cluster.
func (s *Sharded) CloseSale(ctx context.Context, sku string) (Sale, error) {
	return s.Cluster(sku).CloseSale(ctx, sku)
}

// Order reads an order from the cluster that holds it: an order id does
// not name its cluster, so each is asked in turn until one knows it.
func (s *Sharded) Order(ctx context.Context, orderID string) (OrderInfo, error) {
	var err error
	for _, c := range s.clusters {
		var o OrderInfo
		if o, err = c.Order(ctx, orderID); !errors.Is(err, ErrNotFound) {
			return o, err
		}
	}
	return OrderInfo{}, err
}
