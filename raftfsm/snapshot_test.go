package raftfsm

import (
	"bytes"
	"errors"
	"io"
	"stockd.dev/stockd/raftfsm/store"
	"strings"
	"testing"
)

// TestSnapshot_IsAReferenceToTheFileAtTheAppliedIndex: what raft keeps is
// a few bytes naming the applied index, and the file already holds that
// index when Snapshot returns (raft compacts the log right after).
func TestSnapshot_IsAReferenceToTheFileAtTheAppliedIndex(t *testing.T) {
	tl := newLedgerWithATake(t)
	sink := persistSnapshot(t, tl.l)
	if sink.Len() > 64 || sink.cancelled {
		t.Fatalf("the snapshot raft keeps is %d bytes (cancelled %v)", sink.Len(), sink.cancelled)
	}
	ref, rest, err := store.ReadSnapshotRef(sink)
	if err != nil || ref == nil || rest != nil || ref.AppliedIndex != 3 {
		t.Fatalf("read back: %+v %v %v, want a reference at 3", ref, rest, err)
	}
	// The file holds it: a stream of the file reads index 3 back.
	rc, _, index, err := tl.l.OpenStream()
	if err != nil {
		t.Fatal(err)
	}
	rc.Close()
	if index != 3 {
		t.Fatalf("the file holds index %d after Snapshot, want 3", index)
	}
	checkAudit(t, tl.l, "a")
}

// TestRestore_OfAReference: a reference at or below the applied index
// changes nothing; one above it is refused, since only the file it names
// could hold what it says.
func TestRestore_OfAReference(t *testing.T) {
	tl := newTestLedger(t)
	tl.apply(legacyCommand{Op: OpCreateSale, SKU: "a", Sale: &SaleConfig{Total: 50}})
	tl.apply(legacyCommand{Op: OpRestock, SKU: "a", Qty: 5})
	refAt := func(index string) io.ReadCloser {
		return io.NopCloser(strings.NewReader(store.SnapshotRefMagic + `{"applied_index":` + index + `}`))
	}
	if err := tl.l.Restore(refAt("2")); err != nil {
		t.Fatalf("a reference at the applied index: %v", err)
	}
	if err := tl.l.Restore(refAt("1")); err != nil {
		t.Fatalf("a reference below the applied index: %v", err)
	}
	if tl.l.Restores() != 0 || tl.row("a").Total != 55 {
		t.Fatalf("a reference changed the ledger: %d restores, %+v", tl.l.Restores(), tl.row("a"))
	}
	if err := tl.l.Restore(refAt("3")); !errors.Is(err, ErrLedgerBehindSnapshot) {
		t.Fatalf("a reference past the applied index: %v, want ErrLedgerBehindSnapshot", err)
	}
	checkAudit(t, tl.l, "a")
}

// TestReadSnapshotRef_CopiesReadWholeAndDamageIsRefused: a copy of a
// ledger file (which starts with zero bytes) reads back byte for byte; a
// reference that does not decode, or is too long, is an error.
func TestReadSnapshotRef_CopiesReadWholeAndDamageIsRefused(t *testing.T) {
	tl := newTestLedger(t)
	tl.apply(legacyCommand{Op: OpCreateSale, SKU: "a", Sale: &SaleConfig{Total: 50}})
	copied := snapshotOf(t, tl.l).Bytes()
	ref, rest, err := store.ReadSnapshotRef(bytes.NewReader(copied))
	if err != nil || ref != nil {
		t.Fatalf("a copy read as %+v, %v", ref, err)
	}
	if got, err := io.ReadAll(rest); err != nil || !bytes.Equal(got, copied) {
		t.Fatalf("a copy read back %d of %d bytes alike (%v)", len(got), len(copied), err)
	}
	for _, body := range []string{`{"applied_index":`, `[]`, `{"applied_index":1}` + strings.Repeat(" ", store.SnapshotRefMaxBytes)} {
		if ref, _, err := store.ReadSnapshotRef(strings.NewReader(store.SnapshotRefMagic + body)); err == nil {
			t.Fatalf("a damaged reference (%d bytes) read as %+v", len(body), ref)
		}
	}
	if ref, rest, err := store.ReadSnapshotRef(strings.NewReader("")); err != nil || ref != nil || rest == nil {
		t.Fatalf("an empty snapshot: %+v %v %v", ref, rest, err)
	}
	checkAudit(t, tl.l, "a")
}
