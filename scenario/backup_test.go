package scenario

import (
	"bytes"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"stockd.dev/stockd/raftfsm/store"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"stockd.dev/stockd/backup"
	"stockd.dev/stockd/node"
	"stockd.dev/stockd/node/nodetest"
	"stockd.dev/stockd/raftfsm"
	"stockd.dev/stockd/stock"
)

// fetchBackup is GET /v1/backup on c; it returns the body and the index
// the node says it is at.
func fetchBackup(t *testing.T, c *fasthttp.HostClient, query string) ([]byte, uint64) {
	t.Helper()
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(nodetest.URL(c, "/v1/backup"+query))
	if err := c.DoTimeout(req, resp, time.Minute); err != nil {
		t.Fatalf("GET /v1/backup%s: %v", query, err)
	}
	nodetest.Record(req, resp)
	if resp.StatusCode() != 200 {
		t.Fatalf("GET /v1/backup%s: %d %s", query, resp.StatusCode(), resp.Body())
	}
	index, err := strconv.ParseUint(string(resp.Header.Peek("X-Stockd-Applied-Index")), 10, 64)
	if err != nil {
		t.Fatalf("X-Stockd-Applied-Index %q: %v", resp.Header.Peek("X-Stockd-Applied-Index"), err)
	}
	return bytes.Clone(resp.Body()), index
}

// openBackup verifies a backup file and opens the ledger inside it.
func openBackup(t *testing.T, file []byte) (store.BackupHeader, *raftfsm.Ledger) {
	t.Helper()
	dir := t.TempDir()
	path := filepath.Join(dir, "b.backup")
	if err := os.WriteFile(path, file, 0o600); err != nil {
		t.Fatal(err)
	}
	h, err := store.VerifyBackupFile(path, dir)
	if err != nil {
		t.Fatal(err)
	}
	ledgerDir := filepath.Join(dir, "ledger")
	os.Mkdir(ledgerDir, 0o700)
	f, err := os.Create(filepath.Join(ledgerDir, "ledger.db"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.ReadBackup(bytes.NewReader(file), f); err != nil {
		t.Fatal(err)
	}
	f.Close()
	l, err := raftfsm.OpenLedger(ledgerDir, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return h, l
}

// TestBackup_MidSale takes backups from a follower and from the leader
// while buyers buy on all three nodes: each verifies, is at the index the
// node named, obeys the law, and a backup taken with catch_up holds every
// order acknowledged before the call, on whichever node. The sale goes on
// and ends; no unit is sold twice.
func TestBackup_MidSale(t *testing.T) {
	const units = 6000
	c := nodetest.StartCluster(t)
	leader, follower := c.Leader(), c.Follower()
	if code, out := nodetest.Call(t, c.Client(leader), "PUT", "/v1/skus/bk", fmt.Sprintf(`{"total":%d}`, units)); code != 201 {
		t.Fatalf("create sale: %d %v", code, out)
	}
	nodetest.WaitSaleEverywhere(t, c, "bk")

	var mu sync.Mutex
	var acked []string // order ids, in the order their wins were answered
	var next, failed atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl := c.Client(c.IDs[w%len(c.IDs)])
			deadline := time.Now().Add(time.Minute)
			for time.Now().Before(deadline) {
				select {
				case <-stop:
					return
				default:
				}
				b := next.Add(1)
				code, out := nodetest.CallQuiet(cl, "POST", "/v1/skus/bk/deduct", fmt.Sprintf(`{"user":"u%d","request_id":"r%d"}`, b, b))
				switch {
				case code == 200:
					mu.Lock()
					acked = append(acked, out["order_id"].(string))
					mu.Unlock()
				case code == 409 && out["error"] == "sold_out":
					return
				case code != 429:
					failed.Add(1)
				}
			}
		}()
	}
	ackedSoFar := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), acked...)
	}
	nodetest.WaitFor(t, 30*time.Second, "a thousand wins", func() bool { return len(ackedSoFar()) >= 1000 })

	type taken struct {
		name   string
		file   []byte
		index  uint64
		before []string // acknowledged before the call: in the copy when it caught up
	}
	var backups []taken
	for _, b := range []struct{ name, node, query string }{
		{"follower, caught up", follower, "?catch_up=true"},
		{"leader, caught up", leader, "?catch_up=true"},
		{"follower, as applied", follower, ""},
	} {
		before := ackedSoFar()
		file, index := fetchBackup(t, c.Client(b.node), b.query)
		if b.query == "" {
			before = nil
		}
		backups = append(backups, taken{b.name, file, index, before})
	}
	if len(ackedSoFar()) >= units {
		t.Fatal("the sale ended before the backups were taken: not a backup mid-sale")
	}
	wg.Wait()
	close(stop)
	if n := failed.Load(); n > 0 {
		t.Fatalf("%d deducts failed", n)
	}
	final := nodetest.CheckLedger(t, c.Client(leader), "bk")
	if final["sold"].(float64) != units {
		t.Fatalf("the sale ended with %v sold, want %d", final["sold"], units)
	}

	for _, b := range backups {
		h, l := openBackup(t, b.file)
		if h.AppliedIndex != b.index || l.AppliedIndex() != b.index {
			t.Fatalf("%s: header at %d, ledger at %d, the node said %d", b.name, h.AppliedIndex, l.AppliedIndex(), b.index)
		}
		a, ok, err := l.AuditSKU("bk")
		if err != nil || !ok || !a.OK {
			t.Fatalf("%s: audit %+v %v %v", b.name, a, ok, err)
		}
		if a.Row.Sold < int64(len(b.before)) || a.Row.Sold >= units {
			t.Fatalf("%s: %d sold at index %d; %d wins were acknowledged before the call, %d in the end", b.name, a.Row.Sold, b.index, len(b.before), units)
		}
		for _, id := range b.before {
			if o, found, err := l.Order(id); !found || err != nil || o.State != stock.OrderSold {
				t.Fatalf("%s: order %s acknowledged before the call: %+v found %v err %v", b.name, id, o, found, err)
			}
		}
		t.Logf("%s: %d bytes at index %d, %d sold (%d acknowledged before the call)", b.name, len(b.file), b.index, a.Row.Sold, len(b.before))
	}
	// No unit was sold twice: one order per acknowledged win, all distinct.
	seen := map[string]bool{}
	for _, id := range ackedSoFar() {
		if seen[id] {
			t.Fatalf("order %s acknowledged twice", id)
		}
		seen[id] = true
	}
	if len(seen) != units {
		t.Fatalf("%d wins acknowledged, %d sold", len(seen), units)
	}
	for _, id := range c.IDs {
		nodetest.CheckLedger(t, c.Client(id), "bk")
	}
}

// TestBackup_NeedsTheAdminToken: a node with an admin token gives a
// backup to no one else.
func TestBackup_NeedsTheAdminToken(t *testing.T) {
	n := nodetest.StartNodeWith(t, t.TempDir(), func(cfg *node.Config) { cfg.HTTP.AdminToken = "admin-secret" })
	c := nodetest.ClientOf(n, 2)
	if code, out := nodetest.Call(t, c, "GET", "/v1/backup", ""); code != 401 || out["error"] != "unauthorized" {
		t.Fatalf("a backup without the admin token: %d %v", code, out)
	}
	if code, out := nodetest.Call(t, c, "POST", "/v1/backup", ""); code != 405 {
		t.Fatalf("POST /v1/backup: %d %v", code, out)
	}
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	for _, q := range []string{"?catch_up=maybe", ""} {
		req.SetRequestURI(nodetest.URL(c, "/v1/backup"+q))
		req.Header.Set("Authorization", "Bearer admin-secret")
		if err := c.Do(req, resp); err != nil {
			t.Fatal(err)
		}
		nodetest.Record(req, resp)
		want := 200
		if q != "" {
			want = 400
		}
		if resp.StatusCode() != want {
			t.Fatalf("GET /v1/backup%s with the token: %d %s, want %d", q, resp.StatusCode(), resp.Body(), want)
		}
	}
	if !bytes.HasPrefix(resp.Body(), []byte("STOCKDBK")) {
		t.Fatalf("the backup starts %q", resp.Body()[:min(16, len(resp.Body()))])
	}
}

// TestRestore_BackupIntoANewCluster: a backup taken from a follower
// mid-sale, restored into a fresh three-node cluster (the same ids, new
// addresses), holds exactly the source's state at the backup's index: every
// order and request id, the holds with their deadlines, the per-user
// counts, the consumers' cursors; its leases went back to available; it
// sells; a consumer resumes at its cursor, and a cursor from the source
// past the backup gets 410.
func TestRestore_BackupIntoANewCluster(t *testing.T) {
	src := nodetest.StartCluster(t)
	lc := src.Client(src.Leader())
	if code, out := nodetest.Call(t, lc, "PUT", "/v1/skus/rs", `{"total":500,"per_user":2}`); code != 201 {
		t.Fatalf("create sale: %d %v", code, out)
	}
	if code, out := nodetest.Call(t, lc, "PUT", "/v1/skus/held", `{"total":50,"hold_ttl":"10m"}`); code != 201 {
		t.Fatalf("create held sale: %d %v", code, out)
	}
	nodetest.WaitSaleEverywhere(t, src, "rs")
	nodetest.WaitSaleEverywhere(t, src, "held")
	orders := map[string]string{} // request id -> order id, won before the backup
	deduct := func(c *fasthttp.HostClient, sku, user, rid string) (int, map[string]any) {
		return nodetest.Call(t, c, "POST", "/v1/skus/"+sku+"/deduct", fmt.Sprintf(`{"user":%q,"request_id":%q}`, user, rid))
	}
	for i := range 60 {
		c := src.Client(src.IDs[i%3])
		if code, out := deduct(c, "rs", fmt.Sprintf("u%d", i%30), fmt.Sprintf("r%d", i)); code == 200 {
			orders[fmt.Sprintf("r%d", i)] = out["order_id"].(string)
		} else {
			t.Fatalf("deduct %d: %d %v", i, code, out)
		}
	}
	var heldOrder string
	if code, out := deduct(lc, "held", "h1", "h-1"); code != 200 || out["state"] != "held" {
		t.Fatalf("a held deduct: %d %v", code, out)
	} else {
		heldOrder = out["order_id"].(string)
	}
	_, heldBefore := nodetest.Call(t, lc, "GET", "/v1/orders/"+heldOrder, "")
	// A consumer acknowledges a cursor before the backup.
	_, page, body := readEvents(lc, "0", 10, 0)
	if len(page.Events) != 10 {
		t.Fatalf("the feed's first page: %s", body)
	}
	ackAt := page.Events[9].Cursor
	if code, out := nodetest.Call(t, lc, "PUT", "/v1/consumers/shop", fmt.Sprintf(`{"cursor":%q}`, ackAt)); code != 200 {
		t.Fatalf("ack: %d %v", code, out)
	}

	file, index := fetchBackup(t, src.Client(src.Follower()), "?catch_up=true")
	_, srcRow := nodetest.Call(t, lc, "GET", "/v1/skus/rs", "")
	// The source sells on after the backup: none of this is in the copy.
	for i := range 20 {
		if code, out := deduct(lc, "rs", fmt.Sprintf("late%d", i), fmt.Sprintf("late-r%d", i)); code != 200 {
			t.Fatalf("late deduct: %d %v", code, out)
		}
	}
	_, srcPage, _ := readEvents(lc, "0", 1000, 0)
	srcLast := srcPage.Events[len(srcPage.Events)-1].Cursor

	backupPath := filepath.Join(t.TempDir(), "src.backup")
	if err := os.WriteFile(backupPath, file, 0o600); err != nil {
		t.Fatal(err)
	}
	dst := nodetest.StartClusterPrepared(t, 3, restoreEach(t, backupPath, nil), nil)
	dc := dst.Client(dst.Leader())

	// The state at the backup's index, on every node.
	for _, id := range dst.IDs {
		c := dst.Client(id)
		_, row := nodetest.Call(t, c, "GET", "/v1/skus/rs", "")
		if row["sold"] != srcRow["sold"] || row["total"] != srcRow["total"] || row["held"] != srcRow["held"] {
			t.Fatalf("%s: restored %v, the source at the backup %v", id, row, srcRow)
		}
		a := nodetest.CheckLedger(t, c, "rs")
		if a["orders"].(float64) != float64(len(orders)) {
			t.Fatalf("%s: %v orders restored, want %d", id, a["orders"], len(orders))
		}
		nodetest.CheckLedger(t, c, "held")
	}
	// Every request id answers its order; a late one of the source is new here.
	for rid, oid := range orders {
		i, _ := strconv.Atoi(strings.TrimPrefix(rid, "r"))
		code, out := deduct(dst.Client(dst.IDs[i%3]), "rs", fmt.Sprintf("u%d", i%30), rid)
		if code != 200 || out["order_id"] != oid {
			t.Fatalf("repeat %s: %d %v, want order %s", rid, code, out, oid)
		}
	}
	// Per-user counts came along: u0 bought two, the limit.
	if code, out := deduct(dc, "rs", "u0", "r-more"); code != 409 || out["error"] != "user_limit" {
		t.Fatalf("u0's third unit: %d %v, want 409 user_limit", code, out)
	}
	// The hold kept its deadline.
	_, heldAfter := nodetest.Call(t, dc, "GET", "/v1/orders/"+heldOrder, "")
	if heldAfter["state"] != "held" || heldAfter["expires_at"] != heldBefore["expires_at"] {
		t.Fatalf("the held order restored as %v, was %v", heldAfter, heldBefore)
	}
	// The consumer's cursor came along and resumes.
	_, cons := nodetest.Call(t, dc, "GET", "/v1/consumers", "")
	if !strings.Contains(fmt.Sprint(cons), ackAt) {
		t.Fatalf("consumers after the restore: %v, want shop at %s", cons, ackAt)
	}
	code, resumed, body := readEvents(dc, ackAt, 5, 0)
	if code != 200 || len(resumed.Events) != 5 || resumed.Events[0] != srcPage.Events[10] {
		t.Fatalf("resume after %s: %d %s; the source's next event %+v", ackAt, code, body, srcPage.Events[10])
	}
	if idx, _ := feedSeq(t, resumed.Events[0].Cursor); idx > index {
		t.Fatalf("the event after %s is at index %d, past the backup's %d", ackAt, idx, index)
	}
	// Every feed event up to the backup's index, and none after it.
	var want []feedEvent
	for _, e := range srcPage.Events {
		if idx, _ := feedSeq(t, e.Cursor); idx <= index {
			want = append(want, e)
		}
	}
	_, got, _ := readEvents(dc, "0", 1000, 0)
	if !slices.Equal(got.Events, want) || len(want) == len(srcPage.Events) {
		t.Fatalf("the restored feed holds %d events, the source %d up to the backup's index %d (of %d)", len(got.Events), len(want), index, len(srcPage.Events))
	}
	// The source's cursor past the backup is refused, not skipped.
	if code, _, body := readEvents(dc, srcLast, 5, 0); code != 410 {
		t.Fatalf("the source's last cursor %s on the restored cluster: %d %s, want 410", srcLast, code, body)
	}
	// The restored cluster sells, its leases from its own nodes.
	for i := range 30 {
		if code, out := deduct(dst.Client(dst.IDs[i%3]), "rs", fmt.Sprintf("new%d", i), fmt.Sprintf("new-r%d", i)); code != 200 {
			t.Fatalf("a deduct on the restored cluster: %d %v", code, out)
		}
	}
	a := nodetest.CheckLedger(t, dc, "rs")
	for n := range a["leased"].(map[string]any) {
		if !slices.Contains(dst.IDs, n) {
			t.Fatalf("units leased to %s, not a node of the restored cluster: %v", n, a)
		}
	}
	if a["sold"].(float64) != srcRow["sold"].(float64)+30 {
		t.Fatalf("sold %v after 30 more, the backup had %v", a["sold"], srcRow["sold"])
	}
	for _, id := range dst.IDs {
		nodetest.CheckLedger(t, dst.Client(id), "rs")
	}
}

// TestBackup_Scheduled: at a short interval the leader keeps exactly the
// newest -backup-keep files, each a whole backup that verifies; a full
// backup disk is counted and logged, leaves the files there as they were,
// and deducts go on meanwhile.
func TestBackup_Scheduled(t *testing.T) {
	const keep = 3
	dir := filepath.Join(t.TempDir(), "backups")
	full := &atomic.Bool{}
	logs := &logBuffer{}
	n := nodetest.StartNodeWith(t, t.TempDir(), func(cfg *node.Config) {
		cfg.Backups = node.BackupSchedule{Dir: dir, Interval: 150 * time.Millisecond, Keep: keep, FaultFull: full}
		cfg.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	})
	c := nodetest.ClientOf(n, 8)
	if code, out := nodetest.Call(t, c, "PUT", "/v1/skus/sch", `{"total":1000000}`); code != 201 {
		t.Fatalf("create sale: %d %v", code, out)
	}
	var wins, failed atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // buyers all along, bounded in time and count
		defer wg.Done()
		for i := 0; i < 200_000 && wins.Load()+failed.Load() < 200_000; i++ {
			select {
			case <-stop:
				return
			default:
			}
			switch code, _ := nodetest.CallQuiet(c, "POST", "/v1/skus/sch/deduct", fmt.Sprintf(`{"user":"u%d","request_id":"r%d"}`, i, i)); code {
			case 200:
				wins.Add(1)
			case 429:
			default:
				failed.Add(1)
			}
		}
	}()
	defer func() { close(stop); wg.Wait() }()

	files := func() []string {
		t.Helper()
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		return names
	}
	checkFiles := func(when string) {
		t.Helper()
		names := files()
		if len(names) != keep {
			t.Fatalf("%s: %d files in the backup dir, want %d: %v", when, len(names), keep, names)
		}
		var last uint64
		for _, name := range names {
			if !strings.HasPrefix(name, "stockd-n1-") || !strings.HasSuffix(name, ".backup") {
				t.Fatalf("%s: %s in the backup dir", when, name)
			}
			h, err := store.VerifyBackupFile(filepath.Join(dir, name), t.TempDir())
			if err != nil {
				t.Fatalf("%s: %s: %v", when, name, err)
			}
			if h.AppliedIndex < last {
				t.Fatalf("%s: %s is at index %d, before the file named before it (%d)", when, name, h.AppliedIndex, last)
			}
			last = h.AppliedIndex
		}
	}
	nodetest.WaitFor(t, 30*time.Second, "six scheduled backups", func() bool {
		return metricFloat(t, c, "stockd_backups_total") >= 6
	})
	checkFiles("after six backups")
	if ts := metricFloat(t, c, "stockd_backup_last_success_timestamp_seconds"); ts < float64(time.Now().Add(-time.Minute).Unix()) {
		t.Fatalf("the last success at %v", ts)
	}

	// The backup disk fills up.
	full.Store(true)
	failuresBefore, winsBefore := metricFloat(t, c, "stockd_backup_failures_total"), wins.Load()
	nodetest.WaitFor(t, 30*time.Second, "three failed backups", func() bool {
		return metricFloat(t, c, "stockd_backup_failures_total") >= failuresBefore+3
	})
	nodetest.WaitFor(t, 30*time.Second, "deducts while the backup disk is full", func() bool {
		return wins.Load() > winsBefore+100
	})
	if !strings.Contains(logs.String(), "scheduled backup failed; the sale goes on") || !strings.Contains(logs.String(), "no space left on device") {
		t.Fatalf("the node's log does not say the backup failed for want of space:\n%s", logs.String())
	}
	checkFiles("while the disk is full")
	full.Store(false)
	takenBefore := metricFloat(t, c, "stockd_backups_total")
	nodetest.WaitFor(t, 30*time.Second, "a backup once there is room", func() bool {
		return metricFloat(t, c, "stockd_backups_total") > takenBefore
	})
	close(stop)
	wg.Wait()
	stop = make(chan struct{})
	if n := failed.Load(); n > 0 {
		t.Fatalf("%d deducts failed", n)
	}
	a := nodetest.CheckLedger(t, c, "sch")
	if a["sold"].(float64) != float64(wins.Load()) {
		t.Fatalf("sold %v, %d wins answered", a["sold"], wins.Load())
	}
	checkFiles("at the end")
}

// TestRestore_TheOldClusterCannotJoinOrDisturbIt: the restored cluster
// has an identity of its own, carried on every node connection. The old
// cluster (same node ids, same cluster secret) replicating to one of its
// nodes is refused at the connection, before raft reads it; its
// node-to-node calls are refused; one of its nodes asking to join is
// refused. The restored cluster keeps its leader, term and members, and
// sells on.
func TestRestore_TheOldClusterCannotJoinOrDisturbIt(t *testing.T) {
	src := nodetest.StartCluster(t)
	sl := src.Client(src.Leader())
	if code, out := nodetest.Call(t, sl, "PUT", "/v1/skus/id", `{"total":1000}`); code != 201 {
		t.Fatalf("create sale: %d %v", code, out)
	}
	nodetest.WaitSaleEverywhere(t, src, "id")
	for i := range 20 {
		if code, out := nodetest.Call(t, sl, "POST", "/v1/skus/id/deduct", fmt.Sprintf(`{"user":"u%d","request_id":"r%d"}`, i, i)); code != 200 {
			t.Fatalf("deduct: %d %v", code, out)
		}
	}
	file, _ := fetchBackup(t, sl, "?catch_up=true")
	backupPath := filepath.Join(t.TempDir(), "src.backup")
	if err := os.WriteFile(backupPath, file, 0o600); err != nil {
		t.Fatal(err)
	}
	logs := map[string]*logBuffer{}
	dst := nodetest.StartClusterPrepared(t, 3, restoreEach(t, backupPath, func(id string) { logs[id] = &logBuffer{} }), func(cfg *node.Config) {
		cfg.Logger = slog.New(slog.NewTextHandler(logs[cfg.ID], &slog.HandlerOptions{Level: slog.LevelWarn}))
	})
	dl := dst.Leader()
	_, before := nodetest.Call(t, dst.Client(dl), "GET", "/v1/cluster", "")
	target := dst.Follower()

	// The old cluster's leader takes a node of the restored one for a new
	// voter of its own and replicates to it.
	if code, out := nodetest.Call(t, sl, "POST", "/v1/cluster/join", fmt.Sprintf(`{"id":"n9","raft_addr":%q}`, dst.RaftAddr[target])); code != 200 {
		t.Fatalf("the old cluster adds the voter: %d %v", code, out)
	}
	nodetest.WaitFor(t, 20*time.Second, "the restored node to refuse the old leader's raft connections", func() bool {
		return strings.Contains(logs[target].String(), "refused a raft connection of another cluster")
	})
	if !strings.Contains(logs[target].String(), "reason=\"it names no cluster\"") {
		t.Fatalf("the refusal's reason: %s", logs[target].String())
	}

	// Its node-to-node calls, with the same cluster secret, are refused.
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(nodetest.URL(dst.Client(dl), "/internal/v1/propose"))
	req.Header.SetMethod("POST")
	req.Header.Set("X-Stockd-Cluster-Secret", nodetest.ClusterSecret)
	req.Header.Set("X-Stockd-Node", "n1")
	req.SetBodyString("x")
	if err := dst.Client(dl).Do(req, resp); err != nil || resp.StatusCode() != 403 || !bytes.Contains(resp.Body(), []byte("other_cluster")) {
		t.Fatalf("a call of the old cluster's node: %v %d %s", err, resp.StatusCode(), resp.Body())
	}

	// One of its nodes, holding its state, asks to join.
	_, srcNode := nodetest.Call(t, sl, "GET", "/v1/cluster", "")
	joinBody := fmt.Sprintf(`{"id":"n7","raft_addr":"127.0.0.1:9","cluster":"","applied_index":%v}`, srcNode["applied_index"])
	req.Reset()
	resp.Reset()
	req.SetRequestURI(nodetest.URL(dst.Client(dl), "/v1/cluster/join"))
	req.Header.SetMethod("POST")
	req.Header.Set("X-Stockd-Cluster-Secret", nodetest.ClusterSecret)
	req.SetBodyString(joinBody)
	if err := dst.Client(dl).Do(req, resp); err != nil || resp.StatusCode() != 409 || !bytes.Contains(resp.Body(), []byte("other_cluster")) {
		t.Fatalf("a join by the old cluster's node: %v %d %s", err, resp.StatusCode(), resp.Body())
	}

	// The restored cluster is as it was, and sells.
	_, after := nodetest.Call(t, dst.Client(dl), "GET", "/v1/cluster", "")
	if after["leader"] != before["leader"] || after["term"] != before["term"] || len(after["nodes"].([]any)) != 3 {
		t.Fatalf("the restored cluster before %v, after %v", before, after)
	}
	for i := range 20 {
		if code, out := nodetest.Call(t, dst.Client(dst.IDs[i%3]), "POST", "/v1/skus/id/deduct", fmt.Sprintf(`{"user":"new%d","request_id":"nr%d"}`, i, i)); code != 200 {
			t.Fatalf("a deduct on the restored cluster: %d %v", code, out)
		}
	}
	for _, id := range dst.IDs {
		nodetest.WaitFor(t, 10*time.Second, id+" applied the new wins", func() bool {
			_, a := nodetest.CallQuiet(dst.Client(id), "GET", "/v1/skus/id", "")
			return a != nil && a["sold"] == 40.0
		})
		nodetest.CheckLedger(t, dst.Client(id), "id")
	}
}

// restoreEach is a cluster's prepare step: stockd restore of the backup
// at backupPath into every node's data dir, the cluster's nodes its
// voters; then each(id), when set.
func restoreEach(t *testing.T, backupPath string, each func(id string)) func(c *nodetest.Cluster) {
	return func(c *nodetest.Cluster) {
		var peers []string
		for _, p := range c.Peers {
			peers = append(peers, p.ID+"="+p.Addr)
		}
		for _, id := range c.IDs {
			var stdout, stderr bytes.Buffer
			if err := backup.Restore([]string{"-from", backupPath, "-data", c.Dirs[id], "-id", id, "-peers", strings.Join(peers, ",")}, &stdout, &stderr); err != nil {
				t.Fatalf("restore %s: %v %s", id, err, stderr.String())
			}
			if each != nil {
				each(id)
			}
		}
	}
}
