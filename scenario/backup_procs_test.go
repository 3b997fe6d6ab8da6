package scenario

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"stockd.dev/stockd/node/nodetest"
)

// stockdCmd runs the stockd binary bin with args and fails the test with
// its output when it does not exit 0.
func stockdCmd(t *testing.T, bin string, args ...string) string {
	t.Helper()
	out, err := exec.Command(bin, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("stockd %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// TestMultiProcess_BackupRestore: three stockd processes sell under load;
// `stockd backup` takes a copy from a follower (caught up with the leader)
// and one from the leader mid-sale; the sale goes on and ends. Each copy,
// restored with `stockd restore` into a fresh three-process cluster,
// holds the source's state at the backup's index: its totals, every order
// acknowledged before the call, the law, the consumer's cursor; the
// restored cluster sells, and the consumer resumes there.
func TestMultiProcess_BackupRestore(t *testing.T) {
	if os.Getenv("STOCKD_MULTIPROC") == "" {
		t.Skip("set STOCKD_MULTIPROC=1 (make test-multiproc) to run stockd processes")
	}
	const units = 8000
	bin := buildStockd(t, t.TempDir())
	src := startProcClusterOf(t, bin)
	leader := src.Leader()
	if code, out := nodetest.Call(t, src.Client(leader), "PUT", "/v1/skus/bk", fmt.Sprintf(`{"total":%d,"per_user":1}`, units)); code != 201 {
		t.Fatalf("create sale: %d %v", code, out)
	}
	nodetest.WaitSaleEverywhere(t, src, "bk")

	var mu sync.Mutex
	acked := map[string]string{} // order id -> user, in the order answered
	var ackedOrder []string
	var next, failed atomic.Int64
	var wg sync.WaitGroup
	for w := range 24 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := src.Client(src.ids[w%3])
			for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline); {
				b := next.Add(1)
				user := fmt.Sprintf("u%d", b)
				code, out := nodetest.CallQuiet(c, "POST", "/v1/skus/bk/deduct", fmt.Sprintf(`{"user":%q,"request_id":"r%d"}`, user, b))
				switch {
				case code == 200:
					mu.Lock()
					acked[out["order_id"].(string)] = user
					ackedOrder = append(ackedOrder, out["order_id"].(string))
					mu.Unlock()
				case code == 409 && out["error"] == "sold_out":
					return
				case code != 429:
					failed.Add(1)
				}
			}
		}()
	}
	snapshot := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), ackedOrder...)
	}
	nodetest.WaitFor(t, time.Minute, "1,500 wins", func() bool { return len(snapshot()) >= 1500 })
	// A consumer acknowledges a cursor before the backups.
	_, page, body := readEvents(src.Client(leader), "0", 100, 0)
	if len(page.Events) != 100 {
		t.Fatalf("the feed's first page: %s", body)
	}
	ackAt := page.Events[99].Cursor
	if code, out := nodetest.Call(t, src.Client(leader), "PUT", "/v1/consumers/shop", fmt.Sprintf(`{"cursor":%q}`, ackAt)); code != 200 {
		t.Fatalf("ack: %d %v", code, out)
	}

	dir := t.TempDir()
	var follower string
	for _, id := range src.ids {
		if id != leader {
			follower = id
			break
		}
	}
	type taken struct {
		name, file string
		before     []string
	}
	var backups []taken
	for _, b := range []struct {
		name, node string
		args       []string
	}{
		{"follower", follower, []string{"-catch-up"}},
		{"leader", leader, nil},
	} {
		before := snapshot()
		file := filepath.Join(dir, b.name+".backup")
		args := append([]string{"backup", "-target", "http://" + src.httpAddr[b.node], "-out", file}, b.args...)
		t.Logf("%s", strings.TrimSpace(stockdCmd(t, bin, args...)))
		if b.node == leader {
			before = nil // the leader's copy is as applied: no claim about answers on other nodes
		}
		backups = append(backups, taken{b.name, file, before})
	}
	if len(snapshot()) >= units {
		t.Fatal("the sale ended before the backups were taken: not a backup mid-sale")
	}
	wg.Wait()
	if n := failed.Load(); n > 0 {
		t.Fatalf("%d deducts failed", n)
	}
	final := nodetest.CheckLedger(t, src.Client(leader), "bk")
	if final["sold"].(float64) != units || len(acked) != units {
		t.Fatalf("the sale ended with %v sold and %d wins acknowledged, want %d", final["sold"], len(acked), units)
	}

	for _, b := range backups {
		raw, err := os.ReadFile(b.file)
		if err != nil {
			t.Fatal(err)
		}
		h, l := openBackup(t, raw)
		want, _, ok := l.SKU("bk")
		if !ok {
			t.Fatalf("%s: no sale in the backup", b.name)
		}
		dst := newProcCluster(t, bin, nil)
		for _, id := range dst.ids {
			stockdCmd(t, bin, "restore", "-from", b.file, "-data", dst.dataDir[id], "-id", id, "-peers", dst.peers)
		}
		dst.startAll()
		dl := dst.Leader()
		for _, id := range dst.ids {
			a := nodetest.CheckLedger(t, dst.Client(id), "bk")
			if a["sold"].(float64) != float64(want.Sold) || a["orders"].(float64) != float64(want.Sold) || a["total"].(float64) != units {
				t.Fatalf("%s restored, %s: %v; the backup at %d sold %d", b.name, id, a, h.AppliedIndex, want.Sold)
			}
		}
		for _, id := range b.before {
			if code, o := nodetest.Call(t, dst.Client(dl), "GET", "/v1/orders/"+id, ""); code != 200 || o["state"] != "sold" || o["user"] != acked[id] {
				t.Fatalf("%s restored: order %s acknowledged before the backup: %d %v", b.name, id, code, o)
			}
		}
		// The consumer resumes at its cursor.
		if code, resumed, body := readEvents(dst.Client(dl), ackAt, 10, 0); code != 200 || len(resumed.Events) != 10 {
			t.Fatalf("%s restored: resume after %s: %d %s", b.name, ackAt, code, body)
		}
		// It sells what the backup had left, and no more.
		left := units - int(want.Sold)
		won := 0
		for i, deadline := 0, time.Now().Add(time.Minute); won < left && time.Now().Before(deadline); i++ {
			code, out := nodetest.CallQuiet(dst.Client(dst.ids[i%3]), "POST", "/v1/skus/bk/deduct", fmt.Sprintf(`{"user":"new%d","request_id":"nr%d"}`, i, i))
			switch {
			case code == 200:
				won++
			case code == 409 && out["error"] == "sold_out":
				t.Fatalf("%s restored: sold out after %d more, the backup had %d left", b.name, won, left)
			case code != 429:
				t.Fatalf("%s restored: deduct: %d %v", b.name, code, out)
			}
		}
		if code, out := nodetest.Call(t, dst.Client(dl), "POST", "/v1/skus/bk/deduct", `{"user":"one-more","request_id":"one-more"}`); won != left || code != 409 {
			t.Fatalf("%s restored: %d more units sold, the backup had %d left; then %d %v", b.name, won, left, code, out)
		}
		for _, id := range dst.ids {
			nodetest.WaitFor(t, 10*time.Second, id+" applied the rest of the sale", func() bool {
				_, a := nodetest.CallQuiet(dst.Client(id), "GET", "/v1/skus/bk", "")
				return a != nil && a["sold"] == float64(units)
			})
			nodetest.CheckLedger(t, dst.Client(id), "bk")
		}
		t.Logf("%s: restored at index %d with %d sold; sold the %d left", b.name, h.AppliedIndex, want.Sold, left)
		dst.stopAll()
	}
}
