package bench

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"stockd.dev/stockd/client"

	"github.com/valyala/fasthttp"

	"stockd.dev/stockd/internal/loopport"
)

const (
	launchReadyTimeout = 30 * time.Second
	launchStopTimeout  = 20 * time.Second
)

// launched is a stockd process the harness started and must stop.
type launched struct {
	cmd    *exec.Cmd
	url    string
	log    string
	exited chan error
}

// launchCluster starts `stockd serve` (this very binary) n times on free
// loopback ports (loopport.Free: below the kernel's ephemeral range, where
// the bench's own client connections cannot take one before the node
// binds it; another process still could, and launch then fails with a
// clear error), as one cluster (-peers) when n > 1, with data and logs
// under dir, and waits until every node's /readyz answers 200.
// With sec the nodes run on its node certificates and serve HTTPS.
func launchCluster(binary, dir string, n int, noFeed bool, sec *launchTLS, extra ...string) ([]*launched, error) {
	type addrs struct{ http, raft string }
	nodes := make([]addrs, n)
	var peers []string
	for i := range nodes {
		var err error
		if nodes[i].http, err = loopport.Free(); err != nil {
			return nil, fmt.Errorf("find a free http port: %w", err)
		}
		if nodes[i].raft, err = loopport.Free(); err != nil {
			return nil, fmt.Errorf("find a free raft port: %w", err)
		}
		peers = append(peers, fmt.Sprintf("n%d=%s", i+1, nodes[i].raft))
	}
	// A fresh secret per launch: the nodes need one to talk to each other.
	var raw [16]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return nil, fmt.Errorf("make a cluster secret: %w", err)
	}
	secret := hex.EncodeToString(raw[:])
	var out []*launched
	stopAll := func() {
		for _, l := range out {
			l.stop()
		}
	}
	for i, a := range nodes {
		id := fmt.Sprintf("n%d", i+1)
		args := []string{"serve", "-id", id, "-http", a.http, "-raft", a.raft, "-data", filepath.Join(dir, id), "-log-level", "warn"}
		if n > 1 {
			args = append(args, "-peers", strings.Join(peers, ","))
		}
		if noFeed {
			args = append(args, "-no-order-feed")
		}
		if sec != nil {
			args = append(args, sec.nodeArgs(id)...)
		}
		args = append(args, extra...)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			stopAll()
			return nil, err
		}
		logFile, err := os.Create(filepath.Join(dir, id+".log"))
		if err != nil {
			stopAll()
			return nil, err
		}
		cmd := exec.Command(binary, args...)
		cmd.Stdout, cmd.Stderr = logFile, logFile
		cmd.Env = cleanEnv()
		scheme := "http://"
		if sec != nil && sec.https {
			scheme = "https://"
		}
		if sec == nil {
			// The secret goes through the environment, not argv, which ps shows.
			cmd.Env = append(cmd.Env, "STOCKD_CLUSTER_SECRET="+secret)
		}
		if err := cmd.Start(); err != nil {
			logFile.Close()
			stopAll()
			return nil, fmt.Errorf("start %s: %w", binary, err)
		}
		l := &launched{cmd: cmd, url: scheme + a.http, log: logFile.Name(), exited: make(chan error, 1)}
		go func() { l.exited <- cmd.Wait(); logFile.Close() }()
		out = append(out, l)
	}
	client := &fasthttp.Client{}
	if sec != nil && sec.https {
		client.TLSConfig = sec.client
	}
	deadline := time.Now().Add(launchReadyTimeout)
	for _, l := range out {
		for {
			code, _, err := client.GetTimeout(nil, l.url+"/readyz", time.Second)
			if err == nil && code == fasthttp.StatusOK {
				break
			}
			select {
			case err := <-l.exited:
				stopAll()
				return nil, fmt.Errorf("stockd at %s exited before it was ready: %v\n%s", l.url, err, tail(l.log, 20))
			default:
			}
			if time.Now().After(deadline) {
				stopAll()
				return nil, fmt.Errorf("stockd at %s not ready after %s\n%s", l.url, launchReadyTimeout, tail(l.log, 20))
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return out, nil
}

// cleanEnv drops STOCKD_* variables so the launched node runs on the flags
// the harness gives it.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if len(kv) < 7 || kv[:7] != "STOCKD_" {
			env = append(env, kv)
		}
	}
	return env
}

// stop sends SIGTERM to the process the harness started (by its own
// handle) and kills it if it does not exit in time.
func (l *launched) stop() error {
	if err := l.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("signal stockd: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), launchStopTimeout)
	defer cancel()
	select {
	case err := <-l.exited:
		l.exited <- err // a second stop sees the exit too
		var exit *exec.ExitError
		if err != nil && !errors.As(err, &exit) {
			return err
		}
		return nil
	case <-ctx.Done():
		l.cmd.Process.Kill()
		<-l.exited
		return fmt.Errorf("stockd did not stop within %s; killed", launchStopTimeout)
	}
}

// launchNoop starts `stockd noop-server` on a free loopback port.
func launchNoop(binary, dir string) (*launched, error) {
	addr, err := loopport.Free()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	logFile, err := os.Create(filepath.Join(dir, "noop.log"))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(binary, "noop-server", "-http", addr)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("start %s noop-server: %w", binary, err)
	}
	l := &launched{cmd: cmd, url: "http://" + addr, log: logFile.Name(), exited: make(chan error, 1)}
	go func() { l.exited <- cmd.Wait(); logFile.Close() }()
	client := &fasthttp.Client{}
	deadline := time.Now().Add(launchReadyTimeout)
	for {
		if _, _, err := client.GetTimeout(nil, l.url+"/", time.Second); err == nil {
			return l, nil
		}
		if time.Now().After(deadline) {
			l.stop()
			return nil, fmt.Errorf("noop server at %s not answering after %s\n%s", l.url, launchReadyTimeout, tail(l.log, 10))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// launchTLS is the certificates of launched TLS clusters: one CA and
// node certificates n1..n3 for loopback, made with `stockd cert`.
type launchTLS struct {
	dir    string
	client *tls.Config // checks the nodes' HTTPS
	https  bool        // the nodes serve clients HTTPS too, not only TLS among themselves
}

// makeLaunchCerts makes the certificates in dir once (later calls load
// them); https: the nodes serve clients on them too.
func makeLaunchCerts(binary, dir string, https bool) (*launchTLS, error) {
	if _, err := os.Stat(filepath.Join(dir, "ca.pem")); err != nil {
		steps := [][]string{{"cert", "ca", "-out", dir}}
		for i := 1; i <= 3; i++ {
			steps = append(steps, []string{"cert", "node", "-ca", dir, "-id", fmt.Sprintf("n%d", i), "-host", "127.0.0.1,localhost", "-out", dir})
		}
		for _, args := range steps {
			if out, err := exec.Command(binary, args...).CombinedOutput(); err != nil {
				return nil, fmt.Errorf("stockd %s: %v\n%s", strings.Join(args, " "), err, out)
			}
		}
	}
	cfg, err := client.TLSFiles(filepath.Join(dir, "ca.pem"), "", "")
	if err != nil {
		return nil, err
	}
	return &launchTLS{dir: dir, client: cfg, https: https}, nil
}

// nodeArgs are node id's certificate flags: node-to-node TLS, and HTTPS
// when l.https.
func (l *launchTLS) nodeArgs(id string) []string {
	cert, key := filepath.Join(l.dir, id+".pem"), filepath.Join(l.dir, id+"-key.pem")
	args := []string{"-node-cert", cert, "-node-key", key, "-node-ca", filepath.Join(l.dir, "ca.pem")}
	if l.https {
		args = append(args, "-http-cert", cert, "-http-key", key)
	}
	return args
}
