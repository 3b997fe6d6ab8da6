package scenario

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"stockd.dev/stockd/node/nodetest"
	"stockd.dev/stockd/raftfsm"
	"testing"
	"time"
)

// previousVersion is the last commit before ledger rules: its nodes know
// only global request ids.
const previousVersion = "aa92d03"

// buildPreviousStockd builds the previous version's binary from this
// repository's history into dir; it skips the test where the history or
// git is not there.
func buildPreviousStockd(t *testing.T, dir string) string {
	t.Helper()
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git is not installed: the upgrade test builds the previous version from the repository's history")
	}
	if err := exec.Command("git", "cat-file", "-e", previousVersion+"^{commit}").Run(); err != nil {
		t.Skipf("commit %s is not in this clone (a shallow one?): %v", previousVersion, err)
	}
	src := filepath.Join(dir, "src")
	if err := os.MkdirAll(src, 0o755); err != nil {
		t.Fatal(err)
	}
	archive := exec.Command("sh", "-c", fmt.Sprintf("git archive %s | tar -x -C %s", previousVersion, src))
	archive.Dir = ".." // the repository's root: git archive run in a folder archives that folder
	if out, err := archive.CombinedOutput(); err != nil {
		t.Fatalf("unpack %s: %v\n%s", previousVersion, err, out)
	}
	bin := filepath.Join(dir, "stockd-"+previousVersion)
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Dir = src
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build %s: %v\n%s", previousVersion, err, out)
	}
	return bin
}

// TestMultiProcess_RollingUpgradeSwitchesTheRulesLast: three processes of
// the version before ledger rules sell; they are upgraded one at a time,
// each stopped with SIGTERM and started on its data dir with this
// version. Until the last one runs it the ledger keeps global request ids
// (another user's id still answers the first order, on old and new nodes
// alike); then the leader switches the rules and every node applies them
// from one log entry: the ids recorded before answer their own users'
// repeats, another user's id is their own, a reuse gets 422. The ledgers
// end identical and obey the law.
func TestMultiProcess_RollingUpgradeSwitchesTheRulesLast(t *testing.T) {
	if os.Getenv("STOCKD_MULTIPROC") == "" {
		t.Skip("set STOCKD_MULTIPROC=1 (make test-multiproc) to run three stockd processes")
	}
	dir := t.TempDir()
	previous := buildPreviousStockd(t, dir)
	current := buildStockd(t, dir)
	p := startProcClusterOf(t, previous)
	for _, sku := range []string{"phone", "tablet"} {
		if code, body := nodetest.Call(t, p.Client("n1"), "PUT", "/v1/skus/"+sku, `{"total":100}`); code != 201 {
			t.Fatalf("create %s: %d %v", sku, code, body)
		}
		nodetest.WaitSaleEverywhere(t, p, sku)
	}
	buy := func(node, sku, user, req string, qty int) (int, map[string]any) {
		t.Helper()
		var code int
		var out map[string]any
		nodetest.WaitFor(t, 30*time.Second, "an answer that is not 503", func() bool {
			code, out = nodetest.CallQuiet(p.Client(node), "POST", "/v1/skus/"+sku+"/deduct", fmt.Sprintf(`{"user":%q,"qty":%d,"request_id":%q}`, user, qty, req))
			return code != 503 && code != 0
		})
		return code, out
	}
	code, alice := buy("n1", "phone", "alice", "r-1", 1)
	if code != 200 {
		t.Fatalf("alice: %d %v", code, alice)
	}
	rulesOf := func(node string) float64 {
		code, st := nodetest.CallQuiet(p.Client(node), "GET", "/v1/cluster", "")
		if code != 200 {
			return -1
		}
		r, _ := st["ledger_rules"].(float64) // absent on the previous version: 0
		return r
	}
	for i, id := range []string{"n1", "n2", "n3"} {
		p.stop(id)
		p.bin = current
		p.Start(id)
		nodetest.WaitReady(t, p)
		if i == 2 {
			break
		}
		// Some nodes run the previous version: the ledger keeps its
		// rules, under which bob's r-1 names alice's order. The upgraded
		// node does not hand it to him: 422, and nothing is sold.
		code, bob := buy(id, "tablet", "bob", "r-1", 2)
		if code != 422 || bob["error"] != "request_id_reused" || bob["order_id"] != nil {
			t.Fatalf("with %d of 3 nodes upgraded, bob's r-1: %d %v, want 422 request_id_reused (the id names alice's order %v)", i+1, code, bob, alice["order_id"])
		}
		if r := rulesOf(id); r != 0 {
			t.Fatalf("with %d of 3 nodes upgraded, %s reports ledger rules %v", i+1, id, r)
		}
	}
	nodetest.WaitFor(t, 30*time.Second, "this version's ledger rules on every node", func() bool {
		for _, id := range p.ids {
			if rulesOf(id) != float64(raftfsm.RulesCurrent) {
				return false
			}
		}
		return true
	})
	// Every node, the same answers under the new rules.
	for _, id := range p.ids {
		if code, again := buy(id, "phone", "alice", "r-1", 1); code != 200 || again["order_id"] != alice["order_id"] {
			t.Fatalf("%s: alice's repeat after the upgrade: %d %v, want %v", id, code, again, alice["order_id"])
		}
		if code, out := buy(id, "tablet", "alice", "r-1", 1); code != 422 || out["error"] != "request_id_reused" {
			t.Fatalf("%s: alice's r-1 for the tablet: %d %v", id, code, out)
		}
	}
	code, dave := buy("n2", "tablet", "dave", "r-1", 2)
	if code != 200 || dave["order_id"] == alice["order_id"] || dave["sku"] != "tablet" {
		t.Fatalf("dave's r-1 after the upgrade: %d %v", code, dave)
	}
	phone := checkClusterLedgers(t, p, "phone", nil)
	tablet := checkClusterLedgers(t, p, "tablet", nil)
	if phone["sold"] != 1.0 || tablet["sold"] != 2.0 {
		t.Fatalf("sold phone %v tablet %v, want 1 (alice) and 2 (dave)", phone["sold"], tablet["sold"])
	}
}
