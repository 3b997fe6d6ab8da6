package nodetest

import (
	"context"
	"fmt"
	"maps"
	"net"
	"stockd.dev/stockd/node"
	"stockd.dev/stockd/raftfsm"
	"stockd.dev/stockd/raftnode"
	"sync"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// testCluster is real nodes (three unless said) in this process: real raft over loopback
// TCP (through faultNet), real HTTP servers, a data dir each.
type Cluster struct {
	t *testing.T
	// Net carries raft and node-to-node HTTP, and breaks it on demand.
	Net *FaultNet
	// IDs are the nodes' ids (n1, n2, ...); Dirs and RaftAddr their data
	// dirs and raft addresses, which survive a restart; Peers the initial
	// voters.
	IDs      []string
	Dirs     map[string]string
	RaftAddr map[string]string
	Peers    []raftnode.Peer

	// tune adjusts every node's config before it starts.
	tune func(*node.Config)

	mu      sync.Mutex
	nodes   map[string]*node.Node           // nil while stopped
	clients map[string]*fasthttp.HostClient // one pool per running node
}

const (
	RaftTimeout     = 500 * time.Millisecond
	LeaseIdleReturn = 300 * time.Millisecond
	ReclaimAfter    = 2 * time.Second
)

func StartCluster(t *testing.T) *Cluster {
	t.Helper()
	return StartClusterWith(t, nil)
}

// startTestClusterWith starts three nodes whose configs tune adjusts.
func StartClusterWith(t *testing.T, tune func(*node.Config)) *Cluster {
	t.Helper()
	return StartClusterOf(t, 3, tune)
}

// startTestClusterOf starts size nodes, n1 to n<size>.
func StartClusterOf(t *testing.T, size int, tune func(*node.Config)) *Cluster {
	t.Helper()
	return StartClusterPrepared(t, size, nil, tune)
}

// StartClusterPrepared is StartClusterOf with prepare called once the
// nodes' data dirs and raft addresses are chosen and before any starts
// (a restore builds the dirs from a backup there).
func StartClusterPrepared(t *testing.T, size int, prepare func(c *Cluster), tune func(*node.Config)) *Cluster {
	t.Helper()
	c := &Cluster{t: t, tune: tune, Net: NewFaultNet(),
		Dirs: map[string]string{}, RaftAddr: map[string]string{}, nodes: map[string]*node.Node{},
		clients: map[string]*fasthttp.HostClient{}}
	for i := 1; i <= size; i++ {
		c.IDs = append(c.IDs, fmt.Sprintf("n%d", i))
	}
	lns := map[string]net.Listener{}
	for _, id := range c.IDs {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns[id] = ln
		c.Dirs[id] = t.TempDir()
		c.RaftAddr[id] = ln.Addr().String()
		c.Net.Own(c.RaftAddr[id], id)
		c.Peers = append(c.Peers, raftnode.Peer{ID: id, Addr: c.RaftAddr[id]})
	}
	if prepare != nil {
		prepare(c)
	}
	for _, id := range c.IDs {
		c.Start(id, lns[id])
	}
	t.Cleanup(func() {
		c.mu.Lock()
		nodes := maps.Clone(c.nodes)
		c.mu.Unlock()
		for id, n := range nodes {
			if n != nil {
				// Bounded: a node cut off from the quorum cannot drain its
				// takes.
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				n.Stop(ctx)
				cancel()
			}
			c.Net.CloseNode(id)
		}
	})
	WaitReady(t, c)
	WaitRulesCurrent(t, c)
	return c
}

// waitRulesCurrent waits until every running node's ledger applies this
// binary's rules (the leader switches a new cluster's on its first pass).
func WaitRulesCurrent(t *testing.T, c *Cluster) {
	t.Helper()
	WaitFor(t, 30*time.Second, "ledger rules current on every node", func() bool {
		for _, id := range c.NodeIDs() {
			if n := c.Node(id); n != nil && n.Ledger().Rules() != raftfsm.RulesCurrent {
				return false
			}
		}
		return true
	})
}

// start runs node id; ln is its raft listener (nil: listen again on the
// address it had).
func (c *Cluster) Start(id string, ln net.Listener) { c.StartWith(id, ln, nil) }

func (c *Cluster) StartWith(id string, ln net.Listener, tune func(*node.Config)) {
	c.t.Helper()
	if ln == nil {
		var err error
		deadline := time.Now().Add(5 * time.Second)
		for {
			if ln, err = net.Listen("tcp", c.RaftAddr[id]); err == nil || time.Now().After(deadline) {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if err != nil {
			c.t.Fatalf("listen again on %s: %v", c.RaftAddr[id], err)
		}
	}
	cfg := NodeConfig(c.t, id, c.Dirs[id], RaftTimeout)
	cfg.Raft.RaftBind, cfg.Peers = c.RaftAddr[id], c.Peers
	cfg.Engine.LeaseIdleReturn, cfg.Engine.ReclaimAfter = LeaseIdleReturn, ReclaimAfter
	cfg.StreamLayer = &faultLayer{Listener: ln, net: c.Net, self: id}
	cfg.PeerDial = c.Net.HTTPDialer(id)
	if c.tune != nil {
		c.tune(&cfg)
	}
	if tune != nil {
		tune(&cfg)
	}
	n, err := node.Start(cfg)
	if err != nil {
		c.t.Fatalf("start %s: %v", id, err)
	}
	c.Net.Own(n.HTTPAddr(), id)
	c.mu.Lock()
	c.nodes[id] = n
	c.clients[id] = ClientOf(n, 32)
	c.mu.Unlock()
}

func (c *Cluster) Node(id string) *node.Node {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nodes[id]
}

// crash stops a node without draining: no lease is returned, queued takes
// are dropped, as when the process dies.
// TempDir is a new data dir that lives as long as the cluster's test (a
// node that rejoins with none of its old data).
func (c *Cluster) TempDir() string { return c.t.TempDir() }

// Stop stops node id as SIGTERM would (draining); Start brings it back.
func (c *Cluster) Stop(ctx context.Context, id string) error {
	err := c.Node(id).Stop(ctx)
	c.mu.Lock()
	c.nodes[id], c.clients[id] = nil, nil
	c.mu.Unlock()
	return err
}

func (c *Cluster) Crash(id string) {
	n := c.Node(id)
	c.mu.Lock()
	c.nodes[id], c.clients[id] = nil, nil
	c.mu.Unlock()
	n.Crash()
	c.Net.CloseNode(id)
}

func (c *Cluster) Client(id string) *fasthttp.HostClient {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.clients[id]
}

func (c *Cluster) Leader() string {
	for _, id := range c.IDs {
		if n := c.Node(id); n != nil && n.Raft().IsLeader() {
			return id
		}
	}
	return ""
}

// salesCluster is what the sale helpers need of a cluster, in-process or
// made of processes.
type SalesCluster interface {
	NodeIDs() []string
	// client is a connection pool to a running node, nil while it is down.
	Client(id string) *fasthttp.HostClient
}

// Follower is a running node that does not lead ("" if none).
func (c *Cluster) Follower() string {
	leader := c.Leader()
	for _, id := range c.IDs {
		if id != leader && c.Node(id) != nil {
			return id
		}
	}
	return ""
}

func (c *Cluster) NodeIDs() []string { return c.IDs }

func WaitReady(t *testing.T, sc SalesCluster) {
	t.Helper()
	WaitFor(t, 30*time.Second, "every running node ready", func() bool {
		for _, id := range sc.NodeIDs() {
			if cl := sc.Client(id); cl != nil {
				if code, _ := CallQuiet(cl, "GET", "/readyz", ""); code != 200 {
					return false
				}
			}
		}
		return true
	})
}

// waitSaleEverywhere waits until every running node knows the sale.
func WaitSaleEverywhere(t *testing.T, sc SalesCluster, sku string) {
	t.Helper()
	WaitFor(t, 10*time.Second, "sale "+sku+" on every node", func() bool {
		for _, id := range sc.NodeIDs() {
			if c := sc.Client(id); c != nil {
				if code, _ := CallQuiet(c, "GET", "/v1/skus/"+sku, ""); code != 200 {
					return false
				}
			}
		}
		return true
	})
}
