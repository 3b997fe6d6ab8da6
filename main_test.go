package main

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"stockd.dev/stockd/node/nodetest"
)

func TestApplyEnv_FlagWinsOverEnvironment(t *testing.T) {
	env := map[string]string{"STOCKD_ADMIN_TOKEN": "from-env", "STOCKD_ID": "n9", "STOCKD_HTTP": "127.0.0.1:1"}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	var id, token, addr string
	fs := newTestFlagSet(&id, &token, &addr)
	if err := fs.Parse([]string{"-http", "127.0.0.1:2"}); err != nil {
		t.Fatal(err)
	}
	if err := applyEnv(fs, lookup); err != nil {
		t.Fatal(err)
	}
	if id != "n9" || token != "from-env" || addr != "127.0.0.1:2" {
		t.Fatalf("id %q token %q http %q", id, token, addr)
	}
}

func newTestFlagSet(id, token, addr *string) *flag.FlagSet {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.StringVar(id, "id", "n1", "")
	fs.StringVar(token, "admin-token", "", "")
	fs.StringVar(addr, "http", "127.0.0.1:8080", "")
	return fs
}

func TestServe_RefusesUnsafeStarts(t *testing.T) {
	f := func(wantMsg string, args ...string) {
		t.Helper()
		var stdout, stderr bytes.Buffer
		base := []string{"serve", "-data", t.TempDir(), "-raft", "127.0.0.1:0"}
		if code := run(append(base, args...), &stdout, &stderr); code != 1 {
			t.Fatalf("stockd %v: exit %d, want 1 (stderr %q)", args, code, stderr.String())
		}
		if !strings.Contains(stderr.String(), wantMsg) {
			t.Fatalf("stockd %v: stderr %q, want it to say %q", args, stderr.String(), wantMsg)
		}
	}
	f("needs node certificates (-node-cert, -node-key, -node-ca) or, on loopback, -cluster-secret", "-http", "127.0.0.1:0", "-peers", "n1=127.0.0.1:7101,n2=127.0.0.1:7102")
	f("on loopback, -cluster-secret", "-http", "127.0.0.1:0", "-join", "http://127.0.0.1:8081")
	f("needs node certificates: make certificates with `stockd cert ca -out certs`", "-http", "127.0.0.1:0", "-raft", "0.0.0.0:7000")
	f("need all three of -node-cert, -node-key and -node-ca", "-http", "127.0.0.1:0", "-node-cert", "n1.pem")
	f("need -admin-token", "-http", ":0")
	f("need -admin-token", "-http", "0.0.0.0:0")
	f("pass -insecure-no-admin-token", "-http", "[::]:0")
	f("a node id is 1 to 64", "-http", "127.0.0.1:0", "-id", "n/1")
	f(`invalid value "-1" for flag -procs: want auto, 0 (one thread a core) or a count of threads`, "-http", "127.0.0.1:0", "-procs", "-1")
	f(`invalid value "01" for flag -procs`, "-procs", "01")
	f(`invalid value "+2" for flag -procs`, "-procs", "+2")
	f(`invalid value "Auto" for flag -procs`, "-procs", "Auto")
}

// TestServe_ProcsFromTheFlagOrTheEnvironment: -procs reaches the node's
// config from the command line and from STOCKD_PROCS, the flag winning.
func TestServe_ProcsFromTheFlagOrTheEnvironment(t *testing.T) {
	cfg, err := parseServeFlags([]string{"-data", t.TempDir()}, io.Discard)
	if err != nil || !cfg.ProcsAuto || cfg.Procs != 0 {
		t.Fatalf("no -procs: auto %v procs %d, err %v; want auto", cfg.ProcsAuto, cfg.Procs, err)
	}
	cfg, err = parseServeFlags([]string{"-data", t.TempDir(), "-procs", "0"}, io.Discard)
	if err != nil || cfg.ProcsAuto || cfg.Procs != 0 {
		t.Fatalf("-procs 0: auto %v procs %d, err %v; want Go's choice, fixed", cfg.ProcsAuto, cfg.Procs, err)
	}
	cfg, err = parseServeFlags([]string{"-data", t.TempDir(), "-procs", "1"}, io.Discard)
	if err != nil || cfg.ProcsAuto || cfg.Procs != 1 {
		t.Fatalf("-procs 1: auto %v procs %d, err %v", cfg.ProcsAuto, cfg.Procs, err)
	}
	t.Setenv("STOCKD_PROCS", "2")
	if cfg, err = parseServeFlags([]string{"-data", t.TempDir()}, io.Discard); err != nil || cfg.Procs != 2 {
		t.Fatalf("STOCKD_PROCS=2: procs %d, err %v", cfg.Procs, err)
	}
	if cfg, err = parseServeFlags([]string{"-data", t.TempDir(), "-procs", "1"}, io.Discard); err != nil || cfg.Procs != 1 {
		t.Fatalf("STOCKD_PROCS=2 -procs 1: procs %d, err %v", cfg.Procs, err)
	}
	t.Setenv("STOCKD_PROCS", "2")
	if cfg, err = parseServeFlags([]string{"-data", t.TempDir(), "-procs", "auto"}, io.Discard); err != nil || !cfg.ProcsAuto {
		t.Fatalf("STOCKD_PROCS=2 -procs auto: auto %v procs %d, err %v", cfg.ProcsAuto, cfg.Procs, err)
	}
}

func TestServe_AcceptsSafeConfigs(t *testing.T) {
	f := func(args ...string) {
		t.Helper()
		cfg, err := parseServeFlags(append([]string{"-data", t.TempDir()}, args...), io.Discard)
		if err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		if err := cfg.Validate(); err != nil {
			t.Fatalf("%v: %v", args, err)
		}
	}
	f() // the embedded default: loopback, single node, no tokens
	f("-http", "localhost:8080")
	f("-http", ":8080", "-admin-token", "t")
	f("-http", "0.0.0.0:8080", "-insecure-no-admin-token")
	f("-peers", "n1=127.0.0.1:7001", "-cluster-secret", "s")
	f("-raft", "0.0.0.0:7000", "-insecure-plaintext-cluster")
	f("-raft", "10.0.0.1:7000", "-node-cert", "n1.pem", "-node-key", "n1-key.pem", "-node-ca", "ca.pem",
		"-http-cert", "n1.pem", "-http-key", "n1-key.pem", "-http-client-ca", "ca.pem")
}

// TestCert_SubcommandWritesACAAndANodeCertificate: stockd cert, as a
// newcomer runs it, writes the files it names and exits 0; asked again,
// it refuses to overwrite them and exits 1.
func TestCert_SubcommandWritesACAAndANodeCertificate(t *testing.T) {
	dir := t.TempDir()
	for _, args := range [][]string{{"cert", "ca", "-out", dir}, {"cert", "node", "-ca", dir, "-id", "n1", "-host", "127.0.0.1", "-out", dir}} {
		var stdout, stderr bytes.Buffer
		if code := run(args, &stdout, &stderr); code != 0 || !strings.Contains(stdout.String(), "wrote ") {
			t.Fatalf("stockd %v: exit %d, %s%s", args, code, stdout.String(), stderr.String())
		}
	}
	for _, f := range []string{"ca.pem", "ca-key.pem", "n1.pem", "n1-key.pem"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
	}
	var stdout, stderr bytes.Buffer
	if code := run([]string{"cert", "ca", "-out", dir}, &stdout, &stderr); code != 1 || !strings.Contains(stderr.String(), "file exists") {
		t.Fatalf("a second CA over the first: exit %d, %s", code, stderr.String())
	}
}

func TestBackup_SubcommandFetchesAndVerifies(t *testing.T) {
	n := nodetest.StartNode(t, t.TempDir())
	c := nodetest.ClientOf(n, 2)
	if code, out := nodetest.Call(t, c, "PUT", "/v1/skus/s", `{"total":100}`); code != 201 {
		t.Fatalf("create sale: %d %v", code, out)
	}
	for i := range 20 {
		if code, out := nodetest.Call(t, c, "POST", "/v1/skus/s/deduct", fmt.Sprintf(`{"user":"u%d","request_id":"r%d"}`, i, i)); code != 200 {
			t.Fatalf("deduct: %d %v", code, out)
		}
	}
	dir := t.TempDir()
	file := filepath.Join(dir, "s.backup")
	f := func(wantCode int, want string, args ...string) {
		t.Helper()
		var stdout, stderr bytes.Buffer
		code := run(args, &stdout, &stderr)
		if code != wantCode || !strings.Contains(stdout.String()+stderr.String(), want) {
			t.Fatalf("stockd %v: exit %d (want %d), %q (want %q)", args, code, wantCode, stdout.String()+stderr.String(), want)
		}
	}
	f(0, "verified: node n1 at log index", "backup", "-target", "http://"+n.HTTPAddr(), "-out", file)
	f(1, "exists: a backup never overwrites a file", "backup", "-target", "http://"+n.HTTPAddr(), "-out", file)
	f(0, "ok, node n1", "backup", "verify", file)
	f(1, "-out is required", "backup", "-target", "http://"+n.HTTPAddr())
	f(1, "not an http or https URL", "backup", "-target", "ftp://x", "-out", file+"2")

	good, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	damaged := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	flipped := bytes.Clone(good)
	flipped[len(flipped)/2] ^= 0x40
	f(1, "backup damaged: the checksum does not match", "backup", "verify", damaged("flipped", flipped))
	f(1, "backup cut short", "backup", "verify", damaged("cut", good[:len(good)-100]))
	f(1, "unknown backup format: not a stockd backup file", "backup", "verify", damaged("other", []byte("SQLite format 3\x00 not ours")))
	f(1, "no such file", "backup", "verify", filepath.Join(dir, "missing"))
	if leftovers, _ := filepath.Glob(filepath.Join(dir, ".s.backup.partial-*")); len(leftovers) > 0 {
		t.Fatalf("left behind: %v", leftovers)
	}
}

func TestRestore_SubcommandRefusesAndBuilds(t *testing.T) {
	n := nodetest.StartNode(t, t.TempDir())
	c := nodetest.ClientOf(n, 2)
	if code, out := nodetest.Call(t, c, "PUT", "/v1/skus/s", `{"total":100}`); code != 201 {
		t.Fatalf("create sale: %d %v", code, out)
	}
	dir := t.TempDir()
	file := filepath.Join(dir, "s.backup")
	var stdout, stderr bytes.Buffer
	if code := run([]string{"backup", "-target", "http://" + n.HTTPAddr(), "-out", file}, &stdout, &stderr); code != 0 {
		t.Fatalf("backup: %d %s", code, stderr.String())
	}
	good, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	f := func(wantCode int, want string, args ...string) {
		t.Helper()
		var stdout, stderr bytes.Buffer
		code := run(args, &stdout, &stderr)
		if code != wantCode || !strings.Contains(stdout.String()+stderr.String(), want) {
			t.Fatalf("stockd %v: exit %d (want %d), %q (want %q)", args, code, wantCode, stdout.String()+stderr.String(), want)
		}
	}
	damaged := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	flipped := bytes.Clone(good)
	flipped[len(flipped)/2] ^= 0x01
	for _, bad := range []struct{ file, want string }{
		{damaged("flipped", flipped), "backup damaged: the checksum does not match"},
		{damaged("cut", good[:len(good)/3]), "backup cut short"},
		{damaged("other", []byte("#!/bin/sh\necho not a backup\n")), "unknown backup format"},
		{filepath.Join(dir, "missing"), "no such file"},
	} {
		target := filepath.Join(dir, "restored-"+filepath.Base(bad.file))
		f(1, bad.want, "restore", "-from", bad.file, "-data", target, "-id", "n1")
		if _, err := os.Stat(target); !os.IsNotExist(err) {
			t.Fatalf("a refused restore left %s behind: %v", target, err)
		}
	}
	full := t.TempDir()
	os.WriteFile(filepath.Join(full, "keep"), []byte("x"), 0o600)
	f(1, "is not empty (keep, ...)", "restore", "-from", file, "-data", full, "-id", "n1")
	f(1, "-peers does not name -id n1", "restore", "-from", file, "-data", filepath.Join(dir, "p"), "-id", "n1", "-peers", "n2=127.0.0.1:1")
	f(1, "-id is required", "restore", "-from", file, "-data", filepath.Join(dir, "p"))

	restored := filepath.Join(dir, "restored")
	f(0, "the new cluster's log starts at", "restore", "-from", file, "-data", restored, "-id", "n1")
	f(1, `was restored for node "n1": serve it with -id n1`, "serve", "-id", "n2", "-data", restored, "-http", "127.0.0.1:0", "-raft", "127.0.0.1:0")
}

func TestHealth_SaysReadyOrWhyNot(t *testing.T) {
	n := nodetest.StartNode(t, t.TempDir())
	f := func(wantCode int, want string, args ...string) {
		t.Helper()
		var stdout, stderr bytes.Buffer
		if code := run(args, &stdout, &stderr); code != wantCode || !strings.Contains(stdout.String()+stderr.String(), want) {
			t.Fatalf("stockd %v: exit %d (want %d), %q (want %q)", args, code, wantCode, stdout.String()+stderr.String(), want)
		}
	}
	f(0, "ready (leader n1", "health", "-target", "http://"+n.HTTPAddr())
	t.Setenv("STOCKD_HTTP", n.HTTPAddr())
	f(0, "ready", "health")
	f(1, "unreachable", "health", "-target", "http://127.0.0.1:1")
	f(1, "TLS files", "health", "-target", "https://"+n.HTTPAddr(), "-ca", filepath.Join(t.TempDir(), "missing.pem"))
}

func TestServe_CheckConfig(t *testing.T) {
	dir := t.TempDir()
	var stdout, stderr bytes.Buffer
	if code := run([]string{"cert", "ca", "-out", dir}, &stdout, &stderr); code != 0 {
		t.Fatal(stderr.String())
	}
	if code := run([]string{"cert", "node", "-ca", dir, "-id", "n1", "-host", "127.0.0.1", "-out", dir}, &stdout, &stderr); code != 0 {
		t.Fatal(stderr.String())
	}
	certs := []string{"-node-cert", filepath.Join(dir, "n1.pem"), "-node-key", filepath.Join(dir, "n1-key.pem"), "-node-ca", filepath.Join(dir, "ca.pem")}
	f := func(wantCode int, want string, args ...string) {
		t.Helper()
		var stdout, stderr bytes.Buffer
		if code := run(append([]string{"serve", "-check-config", "-data", filepath.Join(dir, "data")}, args...), &stdout, &stderr); code != wantCode || !strings.Contains(stderr.String(), want) {
			t.Fatalf("serve -check-config %v: exit %d (want %d), %q (want %q)", args, code, wantCode, stderr.String(), want)
		}
	}
	f(0, "checks out")
	f(0, "checks out", append([]string{"-id", "n1", "-raft", "0.0.0.0:7000", "-advertise-raft", "10.0.0.1:7000", "-http", "127.0.0.1:0"}, certs...)...)
	f(1, "give -advertise-raft", append([]string{"-id", "n1", "-raft", "0.0.0.0:7000"}, certs...)...)
	f(1, "names node \"n1\", and this node is -id n2", append([]string{"-id", "n2", "-raft", "0.0.0.0:7000", "-advertise-raft", "n2:7000"}, certs...)...)
	f(1, "-admin-token", "-http", "0.0.0.0:8080")
	f(1, "flag provided but not defined: -renamed-flag", "-renamed-flag", "x")
	if _, err := os.Stat(filepath.Join(dir, "data")); !os.IsNotExist(err) {
		t.Fatalf("-check-config touched the data dir: %v", err)
	}
}
