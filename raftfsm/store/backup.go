package store

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	bolt "go.etcd.io/bbolt"
)

// A backup file is a node's ledger as of one applied index, framed so that
// it checks itself:
//
//	magic        "STOCKDBK" (8 bytes)
//	format       uint16, big-endian (BackupFormat)
//	header size  uint32, big-endian, then the header as JSON (BackupHeader)
//	ledger       the bbolt file, header.LedgerBytes bytes
//	checksum     SHA-256 of every byte before it (32 bytes)
//
// The ledger part is a bbolt file like a raft snapshot's: a consistent
// copy taken in one read transaction, so the node goes on applying while
// it is written. The body of GET /v1/backup is such a file, as it is.
const (
	BackupMagic = "STOCKDBK"
	// BackupFormat is the format this version writes and reads.
	BackupFormat = 1
	// backupHeaderMaxBytes bounds the JSON header a reader accepts: a
	// damaged size must not make it allocate gigabytes.
	backupHeaderMaxBytes = 64 << 10
)

// Reasons a backup file is refused, for errors.Is.
var (
	// ErrBackupFormat: not a stockd backup, or a format this version does
	// not read.
	ErrBackupFormat = errors.New("unknown backup format")
	// ErrBackupTruncated: the file ends before its checksum.
	ErrBackupTruncated = errors.New("backup cut short")
	// ErrBackupChecksum: the bytes do not match their checksum, or the
	// ledger inside does not read.
	ErrBackupChecksum = errors.New("backup damaged")
)

// BackupHeader says what a backup holds.
type BackupHeader struct {
	Format int `json:"format"`
	// Node is the node the copy was taken from.
	Node string `json:"node"`
	// AppliedIndex is the raft log index the ledger is at: it holds every
	// entry up to it and none after.
	AppliedIndex uint64    `json:"applied_index"`
	CreatedAt    time.Time `json:"created_at"`
	LedgerBytes  int64     `json:"ledger_bytes"`
	// StockdVersion is the version of the node that wrote it.
	StockdVersion string `json:"stockd_version,omitempty"`
	// Checksum is the file's SHA-256, as ReadBackup read it (not in the
	// header itself).
	Checksum []byte `json:"-"`
}

// Backup is an open, consistent view of the ledger being written out as a
// backup file. Close it when done: it holds a read transaction, which
// keeps the pages it sees from being reused.
type Backup struct {
	tx     *bolt.Tx
	header BackupHeader
}

// NewBackup is a backup of the ledger file as tx sees it, written by node
// (version names its stockd). The backup owns tx: Close rolls it back.
func NewBackup(tx *bolt.Tx, node, version string) *Backup {
	return &Backup{tx: tx, header: BackupHeader{
		Format: BackupFormat, Node: node, AppliedIndex: AppliedIn(tx),
		CreatedAt: time.Now().UTC(), LedgerBytes: tx.Size(), StockdVersion: version,
	}}
}

// Header is what the backup will say about itself.
func (b *Backup) Header() BackupHeader { return b.header }

// AppliedIndex is the log index the copy is at.
func (b *Backup) AppliedIndex() uint64 { return b.header.AppliedIndex }

// Node is the node the copy is taken from.
func (b *Backup) Node() string { return b.header.Node }

// Size is the length of the whole backup file.
func (b *Backup) Size() (int64, error) {
	head, err := json.Marshal(b.header)
	if err != nil {
		return 0, err
	}
	return int64(len(BackupMagic)+6+len(head)) + b.header.LedgerBytes + sha256.Size, nil
}

// WriteTo writes the whole backup file to w.
func (b *Backup) WriteTo(w io.Writer) (int64, error) {
	hash := sha256.New()
	cw := &countingWriter{w: io.MultiWriter(w, hash)}
	head, err := json.Marshal(b.header)
	if err != nil {
		return 0, err
	}
	pre := make([]byte, 0, len(BackupMagic)+6)
	pre = append(pre, BackupMagic...)
	pre = binary.BigEndian.AppendUint16(pre, BackupFormat)
	pre = binary.BigEndian.AppendUint32(pre, uint32(len(head)))
	if _, err := cw.Write(append(pre, head...)); err != nil {
		return cw.n, fmt.Errorf("write backup header: %w", err)
	}
	start := cw.n
	if _, err := b.tx.WriteTo(&pacedWriter{w: cw}); err != nil {
		return cw.n, fmt.Errorf("write backup ledger: %w", err)
	}
	if got := cw.n - start; got != b.header.LedgerBytes {
		return cw.n, fmt.Errorf("BUG: the ledger copy is %d bytes, its header says %d", got, b.header.LedgerBytes)
	}
	n, err := w.Write(hash.Sum(nil))
	cw.n += int64(n)
	if err != nil {
		return cw.n, fmt.Errorf("write backup checksum: %w", err)
	}
	return cw.n, nil
}

// Close ends the backup's read transaction.
func (b *Backup) Close() error { return b.tx.Rollback() }

// backupPaceChunk and backupPaceMax pace a backup so that the sale keeps
// most of the machine: after each chunk of the ledger it waits twice as
// long as the chunk took (a third of a core at most while the reader
// keeps up), but at most backupPaceMax, so that a reader at the end of a
// slow link, which leaves the node idle anyway, loses little. Streamed
// back to back to a reader on the same two cores, backups of a ledger of
// a million orders cost committed deducts a quarter of their rate
// (`scripts/bench-backup.sh` measures it; BENCHMARKS.md, "Growth,
// memory and backups").
const (
	backupPaceChunk = 1 << 20
	backupPaceMax   = 4 * time.Millisecond
)

// pacedWriter is w, paced as backupPaceChunk says.
type pacedWriter struct {
	w     io.Writer
	n     int
	since time.Time
}

func (p *pacedWriter) Write(b []byte) (int, error) {
	if p.since.IsZero() {
		p.since = time.Now()
	}
	n, err := p.w.Write(b)
	if p.n += n; p.n >= backupPaceChunk {
		p.n = 0
		time.Sleep(min(2*time.Since(p.since), backupPaceMax))
		p.since = time.Now()
	}
	return n, err
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// ReadBackup reads a backup file from r, writes its ledger to ledger and
// checks the checksum; the error says what is wrong (errors.Is
// ErrBackupFormat, ErrBackupTruncated or ErrBackupChecksum). The ledger
// written before an error is not to be used.
func ReadBackup(r io.Reader, ledger io.Writer) (BackupHeader, error) {
	hash := sha256.New()
	br := bufio.NewReaderSize(r, 1<<16)
	tee := io.TeeReader(br, hash)
	var h BackupHeader
	pre := make([]byte, len(BackupMagic)+6)
	if n, err := io.ReadFull(tee, pre); err != nil {
		if n >= len(BackupMagic) && string(pre[:len(BackupMagic)]) != BackupMagic || n < len(BackupMagic) && !bytes.HasPrefix([]byte(BackupMagic), pre[:n]) {
			return h, fmt.Errorf("%w: not a stockd backup file", ErrBackupFormat)
		}
		return h, fmt.Errorf("%w: %d bytes, not even a header", ErrBackupTruncated, n)
	}
	if string(pre[:len(BackupMagic)]) != BackupMagic {
		return h, fmt.Errorf("%w: not a stockd backup file", ErrBackupFormat)
	}
	if f := binary.BigEndian.Uint16(pre[len(BackupMagic):]); f != BackupFormat {
		return h, fmt.Errorf("%w: format %d (this version reads format %d)", ErrBackupFormat, f, BackupFormat)
	}
	size := binary.BigEndian.Uint32(pre[len(BackupMagic)+2:])
	if size > backupHeaderMaxBytes {
		return h, fmt.Errorf("%w: a header of %d bytes", ErrBackupChecksum, size)
	}
	head := make([]byte, size)
	if _, err := io.ReadFull(tee, head); err != nil {
		return h, fmt.Errorf("%w: in the header", ErrBackupTruncated)
	}
	if err := json.Unmarshal(head, &h); err != nil {
		return h, fmt.Errorf("%w: the header does not read: %v", ErrBackupChecksum, err)
	}
	if h.Format != BackupFormat || h.LedgerBytes <= 0 {
		return h, fmt.Errorf("%w: the header says format %d, %d ledger bytes", ErrBackupChecksum, h.Format, h.LedgerBytes)
	}
	n, err := io.CopyN(ledger, tee, h.LedgerBytes)
	if err == io.EOF {
		return h, fmt.Errorf("%w: %d of %d ledger bytes", ErrBackupTruncated, n, h.LedgerBytes)
	}
	if err != nil {
		return h, fmt.Errorf("read the ledger: %w", err)
	}
	want := hash.Sum(nil)
	got := make([]byte, len(want))
	if _, err := io.ReadFull(br, got); err != nil {
		return h, fmt.Errorf("%w: before its checksum", ErrBackupTruncated)
	}
	if !bytes.Equal(got, want) {
		return h, fmt.Errorf("%w: the checksum does not match", ErrBackupChecksum)
	}
	h.Checksum = want
	if _, err := br.ReadByte(); err != io.EOF {
		return h, fmt.Errorf("%w: bytes after the checksum", ErrBackupChecksum)
	}
	return h, nil
}

// VerifyBackupFile checks a backup file: its framing and checksum, then the
// ledger inside, opened read-only from a temporary file in dir ("": the
// system's; bbolt's own consistency check, the ledger's format, and that
// it is at the index the header names). The temporary file is removed.
func VerifyBackupFile(path, dir string) (BackupHeader, error) {
	tmp, err := os.CreateTemp(dir, ".stockd-verify-*.db")
	if err != nil {
		return BackupHeader{}, fmt.Errorf("a temporary file for the ledger: %w", err)
	}
	tmp.Close()
	defer os.Remove(tmp.Name())
	return ExtractBackup(path, tmp.Name())
}

// ExtractBackup checks the backup file at path as VerifyBackupFile does
// and leaves the ledger inside it at ledgerPath (replaced), synced. On an
// error what is at ledgerPath is not to be used.
func ExtractBackup(path, ledgerPath string) (BackupHeader, error) {
	f, err := os.Open(path)
	if err != nil {
		return BackupHeader{}, err
	}
	defer f.Close()
	out, err := os.OpenFile(ledgerPath, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return BackupHeader{}, err
	}
	h, err := ReadBackup(f, out)
	if err == nil {
		err = out.Sync()
	}
	if cerr := out.Close(); err == nil && cerr != nil {
		err = cerr
	}
	if err != nil {
		return h, err
	}
	return h, checkBackupLedger(ledgerPath, h)
}

// checkBackupLedger opens a backup's ledger read-only and checks it.
func checkBackupLedger(path string, h BackupHeader) error {
	damaged := func(what string) error { return fmt.Errorf("%w: the ledger inside %s", ErrBackupChecksum, what) }
	return viewFile(path, damaged, func(tx *bolt.Tx) error {
		var first error
		for cerr := range tx.Check() { // read to its end: the check runs on a goroutine of its own
			if first == nil {
				first = cerr
			}
		}
		if first != nil {
			return damaged(first.Error())
		}
		meta := tx.Bucket(BucketMeta)
		if meta == nil {
			return damaged("has no meta bucket")
		}
		if _, err := CheckFormat(meta); err != nil {
			return fmt.Errorf("the ledger inside: %w", err)
		}
		if applied := AppliedIn(tx); applied != h.AppliedIndex {
			return damaged(fmt.Sprintf("is at index %d, the header says %d", applied, h.AppliedIndex))
		}
		return nil
	})
}
