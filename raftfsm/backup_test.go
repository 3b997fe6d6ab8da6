package raftfsm

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"stockd.dev/stockd/raftfsm/store"
	"stockd.dev/stockd/stock"
	"strconv"
	"sync"
	"testing"

	"github.com/hashicorp/raft"
)

// applyOrders applies Takes of n orders (users and request ids from
// first on) to sale s, held by node n1.
func applyOrders(tb testing.TB, tl *testLedger, s string, first, n int) {
	tb.Helper()
	c := &Take{Node: "n1", Entries: make([]TakeEntry, n)}
	for k := range c.Entries {
		seq := strconv.Itoa(first + k)
		c.Entries[k] = TakeEntry{SKU: s, Qty: 1, User: "u" + seq, RequestID: "r-" + seq,
			OrderID: "n1-" + strconv.FormatUint(uint64(first+k+1), 36) + "-z" + seq}
	}
	tl.index++
	tl.l.ApplyBatch([]*raft.Log{{Index: tl.index, Term: 1, Type: raft.LogCommand, Data: EncodeCommand(nil, int64(tl.index), c)}})
}

// backupOf writes a backup of tl's ledger taken now, while more orders
// are applied, and returns it with the index it is at and the sale's
// row at that index.
func backupOf(t *testing.T, tl *testLedger) ([]byte, uint64, stock.SKU) {
	t.Helper()
	b, err := tl.l.BeginBackup("n1", "test")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	row := tl.row("s")
	at := b.Header().AppliedIndex
	if at != tl.index {
		t.Fatalf("the backup is at %d, the ledger applied %d", at, tl.index)
	}
	// The node goes on selling while the copy is written.
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := range 20 {
			applyOrders(t, tl, "s", 10_000+i*100, 100)
		}
	}()
	var buf bytes.Buffer
	n, err := b.WriteTo(&buf)
	wg.Wait()
	if err != nil || n != int64(buf.Len()) {
		t.Fatalf("write backup: %d bytes, %d written: %v", buf.Len(), n, err)
	}
	return buf.Bytes(), at, row
}

func TestBackup_HoldsTheLedgerAtItsIndex(t *testing.T) {
	tl := newTestLedger(t)
	tl.applyTyped(0, &SetRules{Rules: RulesCurrent})
	tl.apply(legacyCommand{Op: OpCreateSale, SKU: "s", Sale: &SaleConfig{Total: 100_000}})
	tl.apply(legacyCommand{Op: OpLease, Node: "n1", SKU: "s", Qty: 50_000})
	applyOrders(t, tl, "s", 0, 3000)
	file, at, row := backupOf(t, tl)
	if tl.row("s").Sold != row.Sold+2000 {
		t.Fatalf("the ledger sold %d after the backup, want %d", tl.row("s").Sold, row.Sold+2000)
	}
	checkAudit(t, tl.l, "s")

	path := filepath.Join(t.TempDir(), "b.stockd-backup")
	if err := os.WriteFile(path, file, 0o600); err != nil {
		t.Fatal(err)
	}
	h, err := store.VerifyBackupFile(path, "")
	if err != nil {
		t.Fatal(err)
	}
	if h.AppliedIndex != at || h.Node != "n1" || h.Format != store.BackupFormat || h.LedgerBytes <= 0 {
		t.Fatalf("header %+v, want index %d", h, at)
	}

	// The ledger inside, opened as a ledger: the state at the index, not after.
	dir := t.TempDir()
	f, err := os.Create(filepath.Join(dir, store.FileName))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.ReadBackup(bytes.NewReader(file), f); err != nil {
		t.Fatal(err)
	}
	f.Close()
	l, err := OpenLedger(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	got, _, ok := l.SKU("s")
	if !ok || got.Sold != row.Sold || got.Total != row.Total || got.Available != row.Available || l.AppliedIndex() != at {
		t.Fatalf("restored %+v at %d, want %+v at %d", got, l.AppliedIndex(), row, at)
	}
	if a := checkAudit(t, l, "s"); a.OrdersSold != 3000 {
		t.Fatalf("the restored ledger holds %d sold orders, want 3000", a.OrdersSold)
	}
	for _, seq := range []int{0, 2999} {
		rec, ok := l.LookupRequest(fmt.Appendf(nil, "u%d", seq), fmt.Appendf(nil, "r-%d", seq))
		if !ok {
			t.Fatalf("request r-%d of u%d not in the restored ledger", seq, seq)
		}
		if o, found, err := l.Order(rec.OrderID); !found || err != nil || o.User != fmt.Sprintf("u%d", seq) {
			t.Fatalf("order %s: %+v %v %v", rec.OrderID, o, found, err)
		}
	}
	if _, ok := l.LookupRequest([]byte("u10000"), []byte("r-10000")); ok {
		t.Fatal("an order applied after the backup's index is in it")
	}
}

func TestBackup_RefusesDamagedFiles(t *testing.T) {
	tl := newTestLedger(t)
	tl.apply(legacyCommand{Op: OpCreateSale, SKU: "s", Sale: &SaleConfig{Total: 1000}})
	tl.apply(legacyCommand{Op: OpLease, Node: "n1", SKU: "s", Qty: 1000})
	applyOrders(t, tl, "s", 0, 500)
	good, _, _ := backupOf(t, tl)
	dir := t.TempDir()
	f := func(name string, file []byte, want error) {
		t.Helper()
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, file, 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := store.VerifyBackupFile(path, dir)
		if !errors.Is(err, want) {
			t.Errorf("%s: %v, want %v", name, err, want)
		}
		if leftovers, _ := filepath.Glob(filepath.Join(dir, ".stockd-verify-*")); len(leftovers) > 0 {
			t.Errorf("%s: left %v behind", name, leftovers)
		}
	}
	flip := func(at int) []byte {
		b := bytes.Clone(good)
		b[at] ^= 0x01
		return b
	}
	f("good", good, nil)
	f("flipped-in-ledger", flip(len(good)/2), store.ErrBackupChecksum)
	f("flipped-in-checksum", flip(len(good)-1), store.ErrBackupChecksum)
	f("flipped-in-header", flip(20), store.ErrBackupChecksum)
	f("cut-in-ledger", good[:len(good)/2], store.ErrBackupTruncated)
	f("cut-before-checksum", good[:len(good)-10], store.ErrBackupTruncated)
	f("cut-in-magic", good[:4], store.ErrBackupTruncated)
	f("empty", nil, store.ErrBackupTruncated)
	f("trailing-bytes", append(bytes.Clone(good), 0), store.ErrBackupChecksum)
	f("another-format", []byte("PK\x03\x04 a zip file, not a backup"), store.ErrBackupFormat)
	later := bytes.Clone(good)
	later[len(store.BackupMagic)+1] = store.BackupFormat + 1
	f("a-later-format", later, store.ErrBackupFormat)
	ledgerFile, err := os.ReadFile(filepath.Join(tl.dir, store.FileName))
	if err != nil {
		t.Fatal(err)
	}
	f("a-bare-ledger-file", ledgerFile, store.ErrBackupFormat)
}
