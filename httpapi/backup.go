package httpapi

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"
)

// Backups opens consistent copies of this node's ledger (GET /v1/backup).
type Backups interface {
	// BeginBackup opens a copy of the ledger as of the index it has
	// applied; the caller writes it out and closes it.
	BeginBackup() (Backup, error)
}

// Backup is one open copy of the ledger, written out as a backup file.
type Backup interface {
	Node() string
	AppliedIndex() uint64
	// Size is the length of the whole file WriteTo writes.
	Size() (int64, error)
	WriteTo(w io.Writer) (int64, error)
	Close() error
}

// BackupStats is what /metrics says of the node's scheduled backups.
type BackupStats struct {
	LastSuccess     time.Time // zero: none yet
	LastBytes       int64
	Taken, Failures uint64
}

// backupChunkBytes is how much of a backup is written between two
// extensions of the connection's write deadline: a backup of gigabytes
// takes longer than -http's write timeout, a stalled reader does not get
// longer than that per chunk.
const backupChunkBytes = 1 << 20

// handleBackup streams a backup file of this node's ledger: the body,
// saved as it is, is the file. With catch_up=true the node first catches
// up with the leader, so that the copy holds every write acknowledged
// before the call.
func (s *Server) handleBackup(ctx *fasthttp.RequestCtx) {
	if s.cfg.Backups == nil {
		writeError(ctx, fasthttp.StatusServiceUnavailable, "unavailable", "this node takes no backups")
		return
	}
	switch v := string(ctx.QueryArgs().Peek("catch_up")); v {
	case "", "false":
	case "true":
		if !s.caughtUp(ctx) {
			return
		}
	default:
		writeError(ctx, fasthttp.StatusBadRequest, "bad_request", "catch_up must be true or false, not "+strconv.Quote(v))
		return
	}
	b, err := s.cfg.Backups.BeginBackup()
	if err != nil {
		writeError(ctx, fasthttp.StatusServiceUnavailable, "unavailable", "cannot take a consistent copy now: "+err.Error())
		return
	}
	index, nodeID := b.AppliedIndex(), b.Node()
	ctx.Response.Header.SetContentType("application/octet-stream")
	ctx.Response.Header.Set("X-Stockd-Applied-Index", strconv.FormatUint(index, 10))
	ctx.Response.Header.Set("Content-Disposition", fmt.Sprintf(`attachment; filename="stockd-%s-%d.backup"`, nodeID, index))
	conn, timeout, logger, started := ctx.Conn(), s.cfg.WriteTimeout, s.logger, time.Now()
	size, err := b.Size()
	if err != nil {
		b.Close()
		writeError(ctx, fasthttp.StatusInternalServerError, "internal", err.Error())
		return
	}
	// The copy is written from a goroutine of fasthttp's stream reader,
	// after this handler returns; it holds nothing of ctx but the
	// connection, whose deadline it extends as it goes.
	ctx.Response.SetBodyStream(fasthttp.NewStreamReader(func(w *bufio.Writer) {
		defer b.Close()
		n, err := b.WriteTo(&deadlineWriter{w: w, conn: conn, timeout: timeout})
		if err == nil {
			err = w.Flush()
		}
		if err != nil {
			logger.Warn("backup not sent to the end", "applied_index", index, "bytes", n, "err", err)
			return
		}
		logger.Info("backup sent", "applied_index", index, "bytes", n, "took", time.Since(started).Round(time.Millisecond))
	}), int(size))
}

// deadlineWriter extends conn's write deadline every backupChunkBytes.
type deadlineWriter struct {
	w       io.Writer
	conn    net.Conn
	timeout time.Duration
	since   int
}

func (d *deadlineWriter) Write(p []byte) (int, error) {
	if d.since += len(p); d.since >= backupChunkBytes {
		d.since = 0
		if err := d.conn.SetWriteDeadline(time.Now().Add(d.timeout)); err != nil {
			return 0, err
		}
	}
	return d.w.Write(p)
}
