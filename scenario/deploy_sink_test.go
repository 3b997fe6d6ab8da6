package scenario

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"go.yaml.in/yaml/v4"
)

// sinkCheckConfig runs stockd sink -check-config with env only and fails
// unless it checks out with no unknown variable.
func sinkCheckConfig(t *testing.T, what, bin string, env []string) {
	t.Helper()
	cmd := exec.Command(bin, "sink", "-check-config")
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH")}, env...)
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "checks out") || strings.Contains(string(out), "matches no flag") {
		t.Fatalf("%s: stockd sink -check-config: %v\n%s", what, err, out)
	}
}

// TestDeploy_SinkPassesCheckConfig: the sink's systemd unit passes
// systemd-analyze verify, and the sink's settings in the unit's env file,
// in compose.yaml and in k8s/stockd-sink.yaml each pass stockd sink
// -check-config, so a renamed flag or variable breaks this test.
func TestDeploy_SinkPassesCheckConfig(t *testing.T) {
	bin := buildStockd(t, t.TempDir())
	root := moduleDir(t)

	unit, err := os.ReadFile(filepath.Join(root, "deploy", "systemd", "stockd-sink.service"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(unit), "\nExecStart=/usr/local/bin/stockd sink\n") {
		t.Fatal("stockd-sink.service: want ExecStart=/usr/local/bin/stockd sink")
	}
	if _, err := exec.LookPath("systemd-analyze"); err == nil {
		tmp := filepath.Join(t.TempDir(), "stockd-sink.service")
		if err := os.WriteFile(tmp, []byte(strings.Replace(string(unit), "ExecStart=/usr/local/bin/stockd ", "ExecStart="+bin+" ", 1)), 0o644); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command("systemd-analyze", "verify", tmp).CombinedOutput(); err != nil || strings.Contains(string(out), "stockd-sink.service") {
			t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
		}
	} else {
		t.Log("systemd-analyze is not installed: the unit is verified in CI")
	}
	sinkCheckConfig(t, "stockd-sink.env", bin, envFile(t, filepath.Join(root, "deploy", "systemd", "stockd-sink.env"), "", ""))

	raw, err := os.ReadFile(filepath.Join(root, "deploy", "compose.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var compose struct {
		Services map[string]struct {
			Command     []string          `yaml:"command"`
			Profiles    []string          `yaml:"profiles"`
			Environment map[string]string `yaml:"environment"`
		} `yaml:"services"`
	}
	if err := yaml.Unmarshal([]byte(expandCompose(string(raw), nil)), &compose); err != nil {
		t.Fatal(err)
	}
	svc, ok := compose.Services["sink"]
	if !ok || len(svc.Command) != 1 || svc.Command[0] != "sink" || len(svc.Profiles) != 1 {
		t.Fatalf("compose.yaml: want a service sink running [sink] under a profile, have %+v", svc)
	}
	var env []string
	for k, v := range svc.Environment {
		env = append(env, k+"="+v)
	}
	sinkCheckConfig(t, "compose service sink", bin, env)

	f, err := os.Open(filepath.Join(root, "deploy", "k8s", "stockd-sink.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var dep struct {
		Kind string `yaml:"kind"`
		Spec struct {
			Replicas int `yaml:"replicas"`
			Template struct {
				Spec struct {
					Containers []struct {
						Args []string `yaml:"args"`
						Env  []struct {
							Name      string         `yaml:"name"`
							Value     string         `yaml:"value"`
							ValueFrom map[string]any `yaml:"valueFrom"`
						} `yaml:"env"`
					} `yaml:"containers"`
				} `yaml:"spec"`
			} `yaml:"template"`
		} `yaml:"spec"`
	}
	if err := yaml.NewDecoder(f).Decode(&dep); err != nil {
		t.Fatal(err)
	}
	cs := dep.Spec.Template.Spec.Containers
	if dep.Kind != "Deployment" || dep.Spec.Replicas != 1 || len(cs) != 1 || strings.Join(cs[0].Args, " ") != "sink" {
		t.Fatalf("stockd-sink.yaml: want a Deployment of one replica running sink, have %+v", dep)
	}
	env = nil
	for _, e := range cs[0].Env {
		v := e.Value
		if e.ValueFrom["secretKeyRef"] != nil {
			v = "a-value-from-the-secret"
			if e.Name == "STOCKD_SINK_DB" {
				v = "postgres://stockd_sink:x@shop-db:5432/shop"
			}
		}
		env = append(env, e.Name+"="+v)
	}
	sinkCheckConfig(t, "the sink's Deployment", bin, env)
}
