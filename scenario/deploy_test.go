package scenario

import (
	"bufio"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v4"
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

	// The check command the unit's header gives, run as written (the
	// paths pointed at this test's files, as the user it names).
	var check string
	for _, line := range strings.Split(string(unit), "\n") {
		if _, rest, ok := strings.Cut(line, "# them with: "); ok {
			check = rest
		}
	}
	if !strings.HasPrefix(check, "sudo -u stockd ") {
		t.Fatalf("the unit's header gives no check command as sudo -u stockd ...: %q", check)
	}
	envSrc, err := os.ReadFile(filepath.Join(root, "deploy", "systemd", "stockd.env"))
	if err != nil {
		t.Fatal(err)
	}
	envCopy := filepath.Join(dir, "stockd.env")
	if err := os.WriteFile(envCopy, []byte(strings.ReplaceAll(string(envSrc), "/etc/stockd/", certDir+"/")), 0o600); err != nil {
		t.Fatal(err)
	}
	check = strings.TrimPrefix(check, "sudo -u stockd ")
	check = strings.NewReplacer("/etc/stockd/stockd.env", envCopy, "exec stockd ", "exec "+bin+" ", "/var/lib/stockd", filepath.Join(dir, "data")).Replace(check)
	cmd := exec.Command("sh", "-c", check)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the unit's check command %q: %v\n%s", check, err, out)
	}
}

// expandCompose substitutes ${VAR} and ${VAR:-default} as compose does,
// from vars.
func expandCompose(s string, vars map[string]string) string {
	return regexp.MustCompile(`\$\{([A-Z0-9_]+)(:-([^}]*))?\}`).ReplaceAllStringFunc(s, func(m string) string {
		sub := regexp.MustCompile(`\$\{([A-Z0-9_]+)(:-([^}]*))?\}`).FindStringSubmatch(m)
		if v, ok := vars[sub[1]]; ok && v != "" {
			return v
		}
		return sub[3]
	})
}

// imageEnv is the ENV of deploy/Dockerfile, as KEY=value.
func imageEnv(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(moduleDir(t), "deploy", "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "ENV "); ok {
			return strings.Fields(rest)
		}
	}
	t.Fatal("deploy/Dockerfile sets no ENV")
	return nil
}

// TestDeploy_ComposeAndManifestsPassCheckConfig: the node commands of
// deploy/compose.yaml and deploy/k8s/stockd.yaml, with their settings and
// the image's, each pass stockd serve -check-config (on certificates made
// as their comments say), so a renamed flag or variable breaks this test;
// and the manifests keep what a three-node StatefulSet needs.
func TestDeploy_ComposeAndManifestsPassCheckConfig(t *testing.T) {
	bin := buildStockd(t, t.TempDir())
	root := moduleDir(t)
	certDir := t.TempDir()
	stockdCmd(t, bin, "cert", "ca", "-out", certDir)
	for _, n := range []string{"n1", "n2", "n3", "stockd-0", "stockd-1", "stockd-2"} {
		stockdCmd(t, bin, "cert", "node", "-ca", certDir, "-id", n, "-host", n+","+n+".stockd-peers,127.0.0.1", "-out", certDir)
	}
	dataDir := filepath.Join(t.TempDir(), "data")
	image := map[string]string{}
	for _, kv := range imageEnv(t) {
		k, v, _ := strings.Cut(kv, "=")
		image[k] = v
	}
	image["STOCKD_DATA"] = dataDir

	// compose.yaml: every service's environment over the image's.
	raw, err := os.ReadFile(filepath.Join(root, "deploy", "compose.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var compose struct {
		Services map[string]struct {
			Environment map[string]string `yaml:"environment"`
		} `yaml:"services"`
	}
	if err := yaml.Unmarshal([]byte(expandCompose(string(raw), map[string]string{"STOCKD_ADMIN_TOKEN": "t"})), &compose); err != nil {
		t.Fatal(err)
	}
	delete(compose.Services, "sink") // TestDeploy_SinkPassesCheckConfig
	if len(compose.Services) != 3 {
		t.Fatalf("compose.yaml has %d node services, want 3", len(compose.Services))
	}
	if tool := composeCmd(); tool != nil { // the file validates with no environment set
		cmd := exec.Command(tool[0], append(tool[1:], "-f", filepath.Join(root, "deploy", "compose.yaml"), "config", "-q")...)
		cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s config with no environment: %v\n%s", strings.Join(tool, " "), err, out)
		}
	}
	for name, svc := range compose.Services {
		env := map[string]string{}
		maps.Copy(env, image)
		maps.Copy(env, svc.Environment)
		var list []string
		for k, v := range env {
			list = append(list, k+"="+strings.ReplaceAll(v, "/certs/", certDir+"/"))
		}
		checkConfig(t, "compose service "+name, bin, []string{"serve"}, list)
	}

	// The manifests.
	f, err := os.Open(filepath.Join(root, "deploy", "k8s", "stockd.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	type envVar struct {
		Name      string         `yaml:"name"`
		Value     string         `yaml:"value"`
		ValueFrom map[string]any `yaml:"valueFrom"`
	}
	var set struct {
		Kind string `yaml:"kind"`
		Spec struct {
			Replicas            int    `yaml:"replicas"`
			PodManagementPolicy string `yaml:"podManagementPolicy"`
			ClusterIP           string `yaml:"clusterIP"`
			PublishNotReady     bool   `yaml:"publishNotReadyAddresses"`
			MinAvailable        int    `yaml:"minAvailable"`
			Template            struct {
				Spec struct {
					Grace      int `yaml:"terminationGracePeriodSeconds"`
					Containers []struct {
						Args      []string `yaml:"args"`
						Env       []envVar `yaml:"env"`
						Readiness struct {
							HTTPGet struct {
								Path string `yaml:"path"`
							} `yaml:"httpGet"`
						} `yaml:"readinessProbe"`
					} `yaml:"containers"`
				} `yaml:"spec"`
			} `yaml:"template"`
		} `yaml:"spec"`
	}
	dec := yaml.NewDecoder(f)
	seen := map[string]bool{}
	for {
		doc := set
		doc.Kind = ""
		if err := dec.Decode(&doc); err != nil {
			break
		}
		seen[doc.Kind] = true
		switch doc.Kind {
		case "Service":
			if doc.Spec.ClusterIP == "None" && !doc.Spec.PublishNotReady {
				t.Fatal("the headless Service does not publish not-ready addresses: the nodes could not find each other before a leader exists")
			}
		case "PodDisruptionBudget":
			if doc.Spec.MinAvailable != 2 {
				t.Fatalf("the PodDisruptionBudget keeps %d available, want 2 (a quorum of three)", doc.Spec.MinAvailable)
			}
		case "StatefulSet":
			ps := doc.Spec.Template.Spec
			switch {
			case doc.Spec.Replicas != 3 || doc.Spec.PodManagementPolicy != "Parallel":
				t.Fatalf("StatefulSet: %d replicas, %q pod management; want 3, Parallel", doc.Spec.Replicas, doc.Spec.PodManagementPolicy)
			case len(ps.Containers) != 1 || ps.Containers[0].Readiness.HTTPGet.Path != "/readyz":
				t.Fatal("StatefulSet: want one container with its readiness probe on /readyz")
			case ps.Grace <= 10:
				t.Fatalf("terminationGracePeriodSeconds %d is not above the drain timeout (10 s)", ps.Grace)
			}
			c := ps.Containers[0]
			for i := range 3 {
				pod := fmt.Sprintf("stockd-%d", i)
				var list []string
				for _, e := range c.Env {
					v := strings.ReplaceAll(e.Value, "$(POD_NAME)", pod)
					switch {
					case e.ValueFrom["fieldRef"] != nil:
						v = pod
					case e.ValueFrom["secretKeyRef"] != nil:
						v = "a-token-from-the-secret"
					}
					list = append(list, e.Name+"="+strings.ReplaceAll(v, "/certs/", certDir+"/"))
				}
				args := slices.Clone(c.Args)
				for j := range args {
					if args[j] == "/data" {
						args[j] = dataDir
					}
				}
				checkConfig(t, "StatefulSet pod "+pod, bin, args, list)
			}
		}
	}
	for _, kind := range []string{"Service", "PodDisruptionBudget", "StatefulSet"} {
		if !seen[kind] {
			t.Fatalf("deploy/k8s/stockd.yaml has no %s", kind)
		}
	}
}
