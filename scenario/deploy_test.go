package scenario

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// envFile reads a KEY=value file (comments and blank lines aside),
// replacing old with new in each value.
func envFile(t *testing.T, path, old, new string) []string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var env []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		env = append(env, strings.ReplaceAll(line, old, new))
	}
	return env
}

// checkConfig runs bin serve -check-config with args and env only: it
// must pass, and every STOCKD_ variable must name a flag.
func checkConfig(t *testing.T, what, bin string, args, env []string) {
	t.Helper()
	cmd := exec.Command(bin, append(append([]string{}, args...), "-check-config")...)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH")}, env...)
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "checks out") || strings.Contains(string(out), "matches no flag") {
		t.Fatalf("%s: stockd %s -check-config: %v\n%s", what, strings.Join(args, " "), err, out)
	}
}

// TestDeploy_SystemdUnit: systemd-analyze verify passes on
// deploy/systemd/stockd.service (its binary's path pointed at this
// build), and the node command it runs, with the settings of
// deploy/systemd/stockd.env, passes stockd serve -check-config.
func TestDeploy_SystemdUnit(t *testing.T) {
	if _, err := exec.LookPath("systemd-analyze"); err != nil {
		t.Skip("systemd-analyze is not installed (Debian's systemd package): the unit is checked in CI")
	}
	bin := buildStockd(t, t.TempDir())
	root := moduleDir(t)
	unit, err := os.ReadFile(filepath.Join(root, "deploy", "systemd", "stockd.service"))
	if err != nil {
		t.Fatal(err)
	}
	var execStart []string
	for _, line := range strings.Split(string(unit), "\n") {
		if rest, ok := strings.CutPrefix(line, "ExecStart="); ok {
			execStart = strings.Fields(rest)
		}
	}
	if len(execStart) < 2 || execStart[0] != "/usr/local/bin/stockd" || execStart[1] != "serve" {
		t.Fatalf("ExecStart %v: want /usr/local/bin/stockd serve ...", execStart)
	}
	dir := t.TempDir()
	tmpUnit := filepath.Join(dir, "stockd.service")
	if err := os.WriteFile(tmpUnit, []byte(strings.Replace(string(unit), "ExecStart=/usr/local/bin/stockd ", "ExecStart="+bin+" ", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("systemd-analyze", "verify", tmpUnit).CombinedOutput(); err != nil || strings.Contains(string(out), "stockd.service") {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}

	certDir := t.TempDir()
	stockdCmd(t, bin, "cert", "ca", "-out", certDir)
	stockdCmd(t, bin, "cert", "node", "-ca", certDir, "-id", "n1", "-host", "10.0.0.1", "-out", certDir)
	env := envFile(t, filepath.Join(root, "deploy", "systemd", "stockd.env"), "/etc/stockd/", certDir+"/")
	args := append([]string{}, execStart[1:]...)
	for i := range args {
		if args[i] == "/var/lib/stockd" {
			args[i] = filepath.Join(dir, "data")
		}
	}
	checkConfig(t, "the systemd unit", bin, args, env)
}
