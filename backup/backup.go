// Package backup is `stockd backup`: it fetches a backup file from a
// running node (GET /v1/backup) and verifies it, or verifies one already
// on disk.
package backup

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"stockd.dev/stockd/client"
	"stockd.dev/stockd/raftfsm/store"
)

// Main runs `stockd backup [flags]` or `stockd backup verify FILE`.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "verify" {
		return verify(args[1:], stdout, stderr)
	}
	return fetch(ctx, args, stdout, stderr)
}

func verify(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("stockd backup verify", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: stockd backup verify FILE\n\nChecks a backup file: its framing, its checksum, and the ledger inside (exit 0), or says what is wrong (exit 1).\nThe ledger is unpacked into $TMPDIR for the check, which needs room for it.")
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return errors.New("verify takes one file")
	}
	h, err := store.VerifyBackupFile(fs.Arg(0), "")
	if err != nil {
		return fmt.Errorf("%s: %w", fs.Arg(0), err)
	}
	fmt.Fprintf(stdout, "%s: ok, %s\n", fs.Arg(0), describe(h))
	return nil
}

func describe(h store.BackupHeader) string {
	return fmt.Sprintf("node %s at log index %d, taken %s, ledger %d bytes (format %d, stockd %s)",
		h.Node, h.AppliedIndex, h.CreatedAt.Format(time.RFC3339), h.LedgerBytes, h.Format, h.StockdVersion)
}

func fetch(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("stockd backup", flag.ContinueOnError)
	fs.SetOutput(stderr)
	target := fs.String("target", "http://127.0.0.1:8080", "the node to copy (any member: a follower's copy is as of what it has applied)")
	out := fs.String("out", "", "the backup file to write (required; never overwritten)")
	catchUp := fs.Bool("catch-up", false, "have the node catch up with the leader first, so that the copy holds every write acknowledged before the call")
	adminToken := fs.String("admin-token", os.Getenv("STOCKD_ADMIN_TOKEN"), "admin token (default $STOCKD_ADMIN_TOKEN)")
	caFile := fs.String("ca", "", "CA bundle (PEM) that checks an https:// target")
	certFile := fs.String("cert", "", "client certificate (PEM), for a node that requires one (-http-client-ca)")
	keyFile := fs.String("key", "", "the key of -cert (PEM)")
	timeout := fs.Duration("timeout", time.Hour, "how long the whole copy may take")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: stockd backup -target URL -out FILE [flags]\n       stockd backup verify FILE\n\nCopies a running node's ledger into a backup file and verifies it.")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *out == "" {
		return errors.New("-out is required: the file to write the backup to")
	}
	u, err := url.Parse(strings.TrimRight(*target, "/"))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("-target %q is not an http or https URL", *target)
	}
	if _, err := os.Lstat(*out); err == nil {
		return fmt.Errorf("%s exists: a backup never overwrites a file", *out)
	}
	var tlsCfg *tls.Config
	if *caFile != "" || *certFile != "" {
		if tlsCfg, err = client.TLSFiles(*caFile, *certFile, *keyFile); err != nil {
			return fmt.Errorf("TLS files: %w", err)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	started := time.Now()
	h, size, err := download(ctx, u.String()+"/v1/backup", *catchUp, *adminToken, tlsCfg, *out)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s: %d bytes in %s, verified: %s\n", *out, size, time.Since(started).Round(time.Millisecond), describe(h))
	return nil
}

// download writes the node's backup to a temporary file beside out,
// verifies it, syncs it and renames it to out: out exists only once it
// holds a whole, checked backup.
func download(ctx context.Context, endpoint string, catchUp bool, adminToken string, tlsCfg *tls.Config, out string) (store.BackupHeader, int64, error) {
	var h store.BackupHeader
	if catchUp {
		endpoint += "?catch_up=true"
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, endpoint, nil)
	if err != nil {
		return h, 0, err
	}
	if adminToken != "" {
		req.Header.Set("Authorization", "Bearer "+adminToken)
	}
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: tlsCfg, Proxy: http.ProxyFromEnvironment}}
	defer hc.CloseIdleConnections()
	resp, err := hc.Do(req)
	if err != nil {
		return h, 0, fmt.Errorf("ask for a backup: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return h, 0, refusal(resp)
	}
	tmp, err := os.CreateTemp(filepath.Dir(out), "."+filepath.Base(out)+".partial-*")
	if err != nil {
		return h, 0, fmt.Errorf("create the backup file: %w", err)
	}
	keep := false
	defer func() {
		if !keep {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	size, err := io.Copy(tmp, resp.Body)
	if err != nil {
		return h, size, fmt.Errorf("receive the backup (%d bytes in): %w", size, err)
	}
	if err := tmp.Sync(); err != nil {
		return h, size, fmt.Errorf("sync the backup file: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return h, size, fmt.Errorf("close the backup file: %w", err)
	}
	// The check unpacks the ledger beside the file: there is room there.
	if h, err = store.VerifyBackupFile(tmp.Name(), filepath.Dir(out)); err != nil {
		return h, size, fmt.Errorf("the backup received does not verify: %w", err)
	}
	// Link, not rename: a file that appeared at out meanwhile is not
	// replaced.
	if err := os.Link(tmp.Name(), out); err != nil {
		return h, size, fmt.Errorf("put the backup in place: %w", err)
	}
	os.Remove(tmp.Name())
	keep = true
	if d, err := os.Open(filepath.Dir(out)); err == nil {
		d.Sync() // the new name survives a crash
		d.Close()
	}
	return h, size, nil
}

// refusal is the error for a node's answer other than 200.
func refusal(resp *http.Response) error {
	var e struct {
		Error  string `json:"error"`
		Detail string `json:"detail"`
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if json.Unmarshal(body, &e) == nil && e.Error != "" {
		return fmt.Errorf("the node refused the backup: %s %s: %s", resp.Status, e.Error, e.Detail)
	}
	return fmt.Errorf("the node refused the backup: %s: %s", resp.Status, strings.TrimSpace(string(body)))
}
