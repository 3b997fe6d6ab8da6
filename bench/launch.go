package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"
)

const (
	launchReadyTimeout = 30 * time.Second
	launchStopTimeout  = 20 * time.Second
)

// launched is a stockd process the harness started and must stop.
type launched struct {
	cmd     *exec.Cmd
	url     string
	dataDir string
	exited  chan error
}

// freeLoopbackPort asks the kernel for a free port. Another process could
// take it before stockd binds it; launch then fails with a clear error.
func freeLoopbackPort() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// launchNode starts `stockd serve` (this very binary) on free loopback
// ports with its data under dir, and waits until /readyz answers 200.
func launchNode(binary, dir string, logTo io.Writer) (*launched, error) {
	httpAddr, err := freeLoopbackPort()
	if err != nil {
		return nil, fmt.Errorf("find a free http port: %w", err)
	}
	raftAddr, err := freeLoopbackPort()
	if err != nil {
		return nil, fmt.Errorf("find a free raft port: %w", err)
	}
	data := filepath.Join(dir, "n1")
	cmd := exec.Command(binary, "serve", "-id", "n1", "-http", httpAddr, "-raft", raftAddr, "-data", data, "-log-level", "warn")
	cmd.Stdout, cmd.Stderr = logTo, logTo
	cmd.Env = cleanEnv()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", binary, err)
	}
	l := &launched{cmd: cmd, url: "http://" + httpAddr, dataDir: data, exited: make(chan error, 1)}
	go func() { l.exited <- cmd.Wait() }()

	client := &fasthttp.Client{}
	deadline := time.Now().Add(launchReadyTimeout)
	for {
		code, _, err := client.GetTimeout(nil, l.url+"/readyz", time.Second)
		if err == nil && code == fasthttp.StatusOK {
			return l, nil
		}
		select {
		case err := <-l.exited:
			return nil, fmt.Errorf("stockd exited before it was ready: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			l.stop()
			return nil, fmt.Errorf("stockd at %s not ready after %s", l.url, launchReadyTimeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
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
