package scenario

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"stockd.dev/stockd/node"
	"stockd.dev/stockd/node/nodetest"
)

// diskFull is a switch a test flips to make writes fail with ENOSPC.
type diskFull struct{ on atomic.Bool }

func (d *diskFull) fault() error {
	if d.on.Load() {
		return syscall.ENOSPC
	}
	return nil
}

// startDiskCluster starts size nodes whose raft logs fail every append
// while their switch is on; tune adjusts each config further.
func startDiskCluster(t *testing.T, size int, tune func(*node.Config)) (*nodetest.Cluster, map[string]*diskFull) {
	t.Helper()
	disks := map[string]*diskFull{}
	for i := 1; i <= size; i++ {
		disks[fmt.Sprintf("n%d", i)] = &diskFull{}
	}
	c := nodetest.StartClusterOf(t, size, func(cfg *node.Config) {
		cfg.Raft.LogFault = disks[cfg.ID].fault
		if tune != nil {
			tune(cfg)
		}
	})
	return c, disks
}

// createSaleEverywhere creates a plain sale of total units and waits until
// every running node knows it.
func createSaleEverywhere(t *testing.T, c *nodetest.Cluster, sku string, total int) {
	t.Helper()
	if code, body := nodetest.Call(t, c.Client(c.IDs[0]), "PUT", "/v1/skus/"+sku, fmt.Sprintf(`{"total":%d}`, total)); code != 201 {
		t.Fatalf("create sale %s: %d %v", sku, code, body)
	}
	nodetest.WaitSaleEverywhere(t, c, sku)
}

// TestDisk_LedgerWritesFailMidSale: a node's ledger.db stops being
// writable mid-sale (a full disk), on a follower and then on the leader.
// The node answers 503 instead of selling, the rest of the cluster goes
// on, nothing acknowledged is lost, and the node sells again once it can
// write; after a restart its ledger holds everything.
func TestDisk_LedgerWritesFailMidSale(t *testing.T) {
	const units = 3000
	c := nodetest.StartCluster(t)
	if code, body := nodetest.Call(t, c.Client(c.IDs[0]), "PUT", "/v1/skus/tv", fmt.Sprintf(`{"total":%d}`, units)); code != 201 {
		t.Fatalf("create sale: %d %v", code, body)
	}
	nodetest.WaitSaleEverywhere(t, c, "tv")
	waves := []map[int]buyerResult{buyWave(c, "tv", 0, 300, 12, nil)}
	next := 300

	for _, role := range []string{"follower", "leader"} {
		victim := c.Leader()
		if role == "follower" {
			victim = c.IDs[0]
			if victim == c.Leader() {
				victim = c.IDs[1]
			}
		}
		full := &diskFull{}
		c.Node(victim).Ledger().SetPersistFault(full.fault)
		full.on.Store(true)
		nodetest.WaitFor(t, 10*time.Second, "the "+role+" "+victim+" refusing deducts with its disk full", func() bool {
			code, out := nodetest.CallQuiet(c.Client(victim), "POST", "/v1/skus/tv/deduct",
				fmt.Sprintf(`{"user":"probe%d","request_id":"probe%d"}`, next, next))
			next++
			return code == 503 && out["error"] == "unavailable"
		})
		// The others keep selling meanwhile.
		for _, id := range c.IDs {
			if id == victim {
				continue
			}
			if code, out := nodetest.Call(t, c.Client(id), "POST", "/v1/skus/tv/deduct",
				fmt.Sprintf(`{"user":"u%d","request_id":"r%d"}`, next, next)); code != 200 {
				t.Fatalf("%s with %s's disk full: %d %v", id, victim, code, out)
			}
			next++
		}
		waves = append(waves, buyWave(c, "tv", next, next+300, 12, nil))
		next += 300
		if c.Node(victim).Ledger().PersistFailures() == 0 {
			t.Fatalf("%s: no failed ledger write counted", victim)
		}
		full.on.Store(false)
		nodetest.WaitFor(t, 10*time.Second, victim+" selling again once it can write", func() bool {
			code, _ := nodetest.CallQuiet(c.Client(victim), "POST", "/v1/skus/tv/deduct",
				fmt.Sprintf(`{"user":"u%d","request_id":"r%d"}`, next, next))
			next++
			return code == 200
		})
		waves = append(waves, buyWave(c, "tv", next, next+300, 12, nil))
		next += 300
	}
	acked := ackedOrders(t, waves...)
	checkClusterLedgers(t, c, "tv", acked)

	// Everything is in ledger.db too: a node restarted on its data dir
	// finds every acknowledged order.
	victim := c.IDs[2]
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Stop(ctx, victim); err != nil {
		t.Fatalf("stop %s: %v", victim, err)
	}
	c.StartWith(victim, nil, nil)
	nodetest.WaitReady(t, c)
	checkClusterLedgers(t, c, "tv", acked)
}

// TestDisk_RaftLogAppendsFail: a single node's raft log stops taking
// appends (a full disk). Deducts answer 503, none is acknowledged without
// being in the log, and selling resumes when the disk has room again.
func TestDisk_RaftLogAppendsFail(t *testing.T) {
	full := &diskFull{}
	cfg := nodetest.NodeConfig(t, "n1", t.TempDir(), 200*time.Millisecond)
	cfg.Raft.LogFault = full.fault
	n, err := node.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Stop(context.Background())
	c := nodetest.ClientOf(n, 16)
	nodetest.WaitFor(t, 10*time.Second, "node ready", func() bool {
		code, _ := nodetest.Call(t, c, "GET", "/readyz", "")
		return code == 200
	})
	if code, body := nodetest.Call(t, c, "PUT", "/v1/skus/tv", `{"total":100}`); code != 201 {
		t.Fatalf("create sale: %d %v", code, body)
	}
	acked := map[string]bool{}
	buy := func(i int) (int, map[string]any) {
		code, out := nodetest.CallQuiet(c, "POST", "/v1/skus/tv/deduct", fmt.Sprintf(`{"user":"u%d","request_id":"r%d"}`, i, i))
		if code == 200 {
			acked[out["order_id"].(string)] = true
		}
		return code, out
	}
	for i := range 10 {
		if code, out := buy(i); code != 200 {
			t.Fatalf("deduct %d: %d %v", i, code, out)
		}
	}
	full.on.Store(true)
	i := 10
	nodetest.WaitFor(t, 15*time.Second, "deducts refused with 503 while the log cannot grow", func() bool {
		code, _ := buy(i)
		i++
		return code == 503
	})
	for range 5 {
		if code, out := buy(i); code == 200 {
			t.Fatalf("deduct %d acknowledged while the raft log takes no appends: %v", i, out)
		}
		i++
	}
	full.on.Store(false)
	nodetest.WaitFor(t, 15*time.Second, "deducts sold again", func() bool {
		code, _ := buy(i)
		i++
		return code == 200
	})
	// A buyer told outcome_unknown retries with its request id: its take
	// may have committed once the log took appends again, and the retry
	// then answers that order.
	for k := 10; k < i; k++ {
		buy(k)
	}
	a := nodetest.CheckLedger(t, c, "tv")
	if int(a["sold"].(float64)) != len(acked) {
		t.Fatalf("sold %v, acknowledged %d", a["sold"], len(acked))
	}
	for order := range acked {
		if code, o := nodetest.Call(t, c, "GET", "/v1/orders/"+order, ""); code != 200 || o["state"] != "sold" {
			t.Fatalf("acknowledged order %s: %d %v", order, code, o)
		}
	}
}

// TestDisk_DamagedLedgerAtStart: a ledger.db cut short or overwritten is
// refused at start with a message that names the file, not a panic and
// not a node serving from a broken ledger.
func TestDisk_DamagedLedgerAtStart(t *testing.T) {
	for _, damage := range []struct {
		name string
		do   func(path string) error
	}{
		{"truncated", func(path string) error {
			return os.Truncate(path, 20<<10) // the meta pages and little else
		}},
		// The free-page list always lies past the two meta pages: opening
		// this file for writing reads past its end (SIGBUS, not an error,
		// until the size check moved before that open).
		{"cut to its meta pages", func(path string) error {
			return os.Truncate(path, int64(2*os.Getpagesize()))
		}},
		{"overwritten past its meta pages", func(path string) error {
			f, err := os.OpenFile(path, os.O_WRONLY, 0)
			if err != nil {
				return err
			}
			defer f.Close()
			st, err := f.Stat()
			if err != nil {
				return err
			}
			metaPages := int64(2 * os.Getpagesize())
			junk := make([]byte, st.Size()-metaPages)
			for i := range junk {
				junk[i] = byte(i*7 + 1)
			}
			_, err = f.WriteAt(junk, metaPages)
			return err
		}},
		{"overwritten", func(path string) error {
			f, err := os.OpenFile(path, os.O_WRONLY, 0)
			if err != nil {
				return err
			}
			defer f.Close()
			_, err = f.WriteAt([]byte(strings.Repeat("not a ledger ", 2048)), 0)
			return err
		}},
	} {
		t.Run(damage.name, func(t *testing.T) {
			dir := t.TempDir()
			n := nodetest.StartNode(t, dir)
			c := nodetest.ClientOf(n, 4)
			if code, body := nodetest.Call(t, c, "PUT", "/v1/skus/tv", `{"total":100}`); code != 201 {
				t.Fatalf("create sale: %d %v", code, body)
			}
			for i := range 20 {
				if code, out := nodetest.Call(t, c, "POST", "/v1/skus/tv/deduct", fmt.Sprintf(`{"user":"u%d"}`, i)); code != 200 {
					t.Fatalf("deduct: %d %v", code, out)
				}
			}
			if err := n.Stop(context.Background()); err != nil {
				t.Fatal(err)
			}
			ledger := filepath.Join(dir, "ledger.db")
			if err := damage.do(ledger); err != nil {
				t.Fatal(err)
			}
			n2, err := node.Start(nodetest.NodeConfig(t, "n1", dir, 200*time.Millisecond))
			if err == nil {
				n2.Stop(context.Background())
				t.Fatalf("a node started on a %s ledger.db", damage.name)
			}
			if !strings.Contains(err.Error(), "ledger.db") {
				t.Fatalf("start on a %s ledger: %v; want the error to name ledger.db", damage.name, err)
			}
			t.Logf("refused: %v", err)

			// What the message advises: moved away, the ledger is rebuilt
			// from the raft log, every order back.
			if err := os.Rename(ledger, ledger+".damaged"); err != nil {
				t.Fatal(err)
			}
			n3 := nodetest.StartNode(t, dir)
			a := nodetest.CheckLedger(t, nodetest.ClientOf(n3, 1), "tv")
			if a["sold"] != 20.0 || a["orders"] != 20.0 {
				t.Fatalf("rebuilt ledger: %v, want the 20 orders sold before", a)
			}
		})
	}
}

// TestDisk_FollowerCatchesUpAfterItsDiskRefusedAppends: a follower's raft
// log refuses appends for a second mid-sale, so it rejects what the leader
// sends. With hashicorp/raft's pipelined replication that rejection ended
// the pipeline's reader while its sender waited, and the leader never sent
// that follower anything again (the nemesis found it stuck minutes
// behind). Once the disk has room the follower must catch up.
func TestDisk_FollowerCatchesUpAfterItsDiskRefusedAppends(t *testing.T) {
	c, disks := startDiskCluster(t, 3, nil)
	createSaleEverywhere(t, c, "tv", 100000)
	leader := c.Leader()
	follower := c.IDs[0]
	if follower == leader {
		follower = c.IDs[1]
	}
	var waves []map[int]buyerResult
	next := 0
	for round := range 12 {
		// Buyers on the other nodes keep the leader appending while the
		// follower's disk is full.
		done := make(chan map[int]buyerResult, 1)
		go func() { done <- buyWave(c, "tv", next, next+600, 16, nil) }()
		disks[follower].on.Store(true)
		nodetest.WaitFor(t, 10*time.Second, follower+" refusing appends", func() bool {
			return c.Node(follower).Raft().Status().AppliedIndex < c.Node(c.Leader()).Raft().Status().CommitIndex
		})
		time.Sleep(300 * time.Millisecond) // the fault's length, not a wait for a condition
		disks[follower].on.Store(false)
		waves = append(waves, <-done)
		next += 600
		nodetest.WaitFor(t, 20*time.Second, fmt.Sprintf("round %d: %s caught up with the leader", round, follower), func() bool {
			l := c.Node(c.Leader())
			return l != nil && c.Node(follower).Raft().Status().AppliedIndex >= l.Raft().Status().CommitIndex
		})
	}
	checkClusterLedgers(t, c, "tv", ackedOrders(t, waves...))
}

// TestDisk_NewLeaderWithoutAQuorumReadsStale: a node that has just become
// leader has not applied what the old leader committed until it commits
// in its own term. CI's nemesis caught such a leader, unable to commit (one
// node down, another's disk full), serving a sold count older than an
// acknowledged sale and calling it fresh. Until its first commit its reads
// must say stale and its deducts 503.
func TestDisk_NewLeaderWithoutAQuorumReadsStale(t *testing.T) {
	c, disks := startDiskCluster(t, 3, nil)
	createSaleEverywhere(t, c, "tv", 100)
	old := c.Leader()
	var down, heir string
	for _, id := range c.IDs {
		if id != old {
			if down == "" {
				down = id
			} else {
				heir = id
			}
		}
	}
	c.Crash(down)
	// The old leader's disk fills up; it hands leadership over. The heir
	// then cannot commit anything: its only peer cannot append.
	disks[old].on.Store(true)
	if err := c.Node(old).Raft().TransferLeadershipTo(heir, c.RaftAddr[heir]); err != nil {
		t.Fatalf("transfer leadership from %s: %v", old, err)
	}
	nodetest.WaitFor(t, 10*time.Second, heir+" leading", func() bool { return c.Node(heir).Raft().IsLeader() })
	for range 5 {
		code, sku := nodetest.Call(t, c.Client(heir), "GET", "/v1/skus/tv", "")
		if code != 200 || sku["stale"] != true {
			t.Fatalf("read on a leader that has not committed in its term: %d %v, want stale", code, sku)
		}
		if code, out := nodetest.CallQuiet(c.Client(heir), "POST", "/v1/skus/tv/deduct", `{"user":"u","request_id":"r"}`); code == 200 {
			t.Fatalf("deduct acknowledged by a leader that cannot commit: %v", out)
		}
	}
	disks[old].on.Store(false)
	nodetest.WaitFor(t, 15*time.Second, heir+" fresh once it can commit", func() bool {
		_, sku := nodetest.CallQuiet(c.Client(heir), "GET", "/v1/skus/tv", "")
		return sku != nil && sku["stale"] == nil
	})
	c.StartWith(down, nil, nil)
	nodetest.WaitReady(t, c)
	checkClusterLedgers(t, c, "tv", nil)
}
