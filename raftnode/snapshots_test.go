package raftnode

import (
	"testing"

	"stockd.dev/stockd/raftfsm/command"
	"stockd.dev/stockd/stock"
)

func TestSnapshotThreshold_GrowsWithTheLedger(t *testing.T) {
	for _, c := range []struct {
		base  uint64
		bytes int64
		mean  float64
		want  uint64
	}{
		{8192, 0, 100, 8192},                      // no ledger size known: raft's own
		{8192, 1 << 20, 100, 8192},                // a small ledger: the base
		{8192, 2 << 30, 4096, 2 << 30 / 4 / 4096}, // 2 GiB, 4 KiB entries: half a GiB of log
		{8192, 2 << 30, 0, 8192},                  // no entries yet
	} {
		if got := snapshotThreshold(c.base, c.bytes, c.mean); got != c.want {
			t.Errorf("snapshotThreshold(%d, %d, %v) = %d, want %d", c.base, c.bytes, c.mean, got, c.want)
		}
	}
}

func TestNode_SnapshotThresholdFollowsTheLedgersSize(t *testing.T) {
	dir := t.TempDir()
	n, l := startTestNode(t, dir)
	defer l.Close()
	defer n.Close()
	n.cfg.SnapshotThreshold = 1 // so that the ledger's size decides
	mustPropose(t, n, &command.CreateSale{SKU: "s", Sale: stock.SaleConfig{Total: 1000}})
	for i := range 20 {
		mustPropose(t, n, &command.Restock{SKU: "s", Qty: int64(i + 1)})
	}
	if err := l.Flush(); err != nil {
		t.Fatal(err)
	}
	n.applySnapshotPolicy()
	entries, bytes := n.logGuard.appended.Load(), n.logGuard.appendedBytes.Load()
	want := snapshotThreshold(1, l.FileBytes(), float64(bytes)/float64(entries))
	if want <= 1 {
		t.Fatalf("a ledger of %d bytes and entries of %d bytes gives threshold %d: the test needs more", l.FileBytes(), bytes/entries, want)
	}
	if got := n.SnapshotThreshold(); got != want {
		t.Fatalf("raft's snapshot threshold is %d, want %d (ledger %d bytes, %d entries of %d bytes)", got, want, l.FileBytes(), entries, bytes)
	}
}
