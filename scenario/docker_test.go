package scenario

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"stockd.dev/stockd/node/nodetest"
)

// needDocker skips the test, saying why, when no Docker engine answers.
func needDocker(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("docker"); err != nil {
		t.Skip("docker is not installed: the image tests need a Docker engine (CI has one)")
	}
	if out, err := exec.Command("docker", "info", "--format", "{{.ServerVersion}}").CombinedOutput(); err != nil {
		t.Skipf("no Docker engine answers (%v: %s): the image tests need one (CI has one)", err, strings.TrimSpace(string(out)))
	}
}

// docker runs the docker CLI and fails the test with its output on error.
func docker(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command("docker", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("docker %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

func randomSuffix(t *testing.T) string {
	b := make([]byte, 4)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// buildImage builds deploy/Dockerfile from a context holding a static
// binary, tagged with a name of the test's; it is removed at the end.
func buildImage(t *testing.T) string {
	t.Helper()
	ctx := t.TempDir()
	build := exec.Command("go", "build", "-trimpath", "-o", filepath.Join(ctx, "stockd"), "stockd.dev/stockd")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build a static stockd: %v\n%s", err, out)
	}
	if err := os.Mkdir(filepath.Join(ctx, "data"), 0o755); err != nil {
		t.Fatal(err)
	}
	tag := "stockd-test:" + randomSuffix(t)
	docker(t, "build", "-q", "-f", filepath.Join(moduleDir(t), "deploy", "Dockerfile"), "-t", tag, ctx)
	t.Cleanup(func() { exec.Command("docker", "rmi", "-f", tag).Run() })
	return tag
}

// moduleDir is the repository's root (the scenario tests run in scenario/).
func moduleDir(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestDocker_Image builds the image from deploy/Dockerfile, checks what it
// declares (a user that is not root, the entrypoint, the data volume, the
// ports, a health check through stockd health), then runs it on a network
// of the test's own with node certificates made by stockd cert: it turns
// healthy, sells through its published port, and stops cleanly on
// SIGTERM within the drain timeout.
func TestDocker_Image(t *testing.T) {
	needDocker(t)
	tag := buildImage(t)
	var img []struct {
		Config struct {
			User         string
			Entrypoint   []string
			Cmd          []string
			Volumes      map[string]any
			ExposedPorts map[string]any
			Healthcheck  struct{ Test []string }
			Env          []string
		}
	}
	if err := json.Unmarshal([]byte(docker(t, "image", "inspect", tag)), &img); err != nil || len(img) != 1 {
		t.Fatalf("image inspect: %v", err)
	}
	c := img[0].Config
	switch {
	case c.User == "" || c.User == "root" || strings.HasPrefix(c.User, "0:") || c.User == "0":
		t.Fatalf("the image runs as %q", c.User)
	case !slices.Equal(c.Entrypoint, []string{"/stockd"}) || !slices.Equal(c.Cmd, []string{"serve"}):
		t.Fatalf("entrypoint %v, cmd %v", c.Entrypoint, c.Cmd)
	case c.Volumes["/data"] == nil:
		t.Fatalf("volumes %v: no /data", c.Volumes)
	case c.ExposedPorts["8080/tcp"] == nil || c.ExposedPorts["7000/tcp"] == nil:
		t.Fatalf("exposed ports %v", c.ExposedPorts)
	case !slices.Equal(c.Healthcheck.Test, []string{"CMD", "/stockd", "health"}):
		t.Fatalf("health check %v", c.Healthcheck.Test)
	}

	// Certificates made by stockd cert, readable by the image's user.
	bin := buildStockd(t, t.TempDir())
	certDir := t.TempDir()
	stockdCmd(t, bin, "cert", "ca", "-out", certDir)
	stockdCmd(t, bin, "cert", "node", "-ca", certDir, "-id", "n1", "-host", "127.0.0.1,n1", "-out", certDir)
	for _, f := range []string{"ca.pem", "n1.pem", "n1-key.pem"} {
		p := filepath.Join(certDir, f)
		if err := os.Chmod(p, 0o644); err != nil { // a test dir: the key is readable by the container's user
			t.Fatal(err)
		}
	}
	os.Chmod(certDir, 0o755)

	network := "stockd-test-" + randomSuffix(t)
	docker(t, "network", "create", network)
	t.Cleanup(func() { exec.Command("docker", "network", "rm", network).Run() })
	name := "stockd-test-" + randomSuffix(t)
	docker(t, "run", "-d", "--name", name, "--network", network, "--hostname", "n1", "-p", "127.0.0.1::8080",
		"-v", certDir+":/certs:ro", "-e", "STOCKD_ADMIN_TOKEN=test-admin-token",
		"-e", "STOCKD_ADVERTISE_RAFT=n1:7000", "-e", "STOCKD_NODE_CERT=/certs/n1.pem", "-e", "STOCKD_NODE_KEY=/certs/n1-key.pem", "-e", "STOCKD_NODE_CA=/certs/ca.pem",
		tag)
	t.Cleanup(func() { exec.Command("docker", "rm", "-f", "-v", name).Run() }) // -v: its anonymous /data volume too
	defer func() {
		if t.Failed() {
			out, _ := exec.Command("docker", "logs", "--tail", "40", name).CombinedOutput()
			t.Logf("the container's log:\n%s", out)
		}
	}()
	nodetest.WaitFor(t, 90*time.Second, "the container healthy", func() bool {
		return docker(t, "inspect", "-f", "{{.State.Health.Status}}", name) == "healthy"
	})
	addr := strings.TrimPrefix(docker(t, "port", name, "8080/tcp"), "0.0.0.0:")
	cl := &fasthttp.HostClient{Addr: addr, ReadTimeout: 10 * time.Second}
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI("http://" + addr + "/v1/skus/box")
	req.Header.SetMethod("PUT")
	req.Header.Set("Authorization", "Bearer test-admin-token")
	req.SetBodyString(`{"total":50}`)
	if err := cl.Do(req, resp); err != nil || resp.StatusCode() != 201 {
		t.Fatalf("create a sale in the container: %v %d %s", err, resp.StatusCode(), resp.Body())
	}
	for i := range 60 {
		code, out := nodetest.Call(t, cl, "POST", "/v1/skus/box/deduct", fmt.Sprintf(`{"user":"u%d","request_id":"r%d"}`, i, i))
		if (i < 50 && code != 200) || (i >= 50 && (code != 409 || out["error"] != "sold_out")) {
			t.Fatalf("deduct %d in the container: %d %v", i, code, out)
		}
	}
	if a := nodetest.CheckLedger(t, cl, "box"); a["sold"].(float64) != 50 {
		t.Fatalf("sold %v, want 50", a["sold"])
	}
	start := time.Now()
	docker(t, "stop", "-t", "20", name)
	if took := time.Since(start); took > 15*time.Second {
		t.Fatalf("the container took %s to stop on SIGTERM", took)
	}
	if code := docker(t, "inspect", "-f", "{{.State.ExitCode}}", name); code != "0" {
		t.Fatalf("the container exited with %s after SIGTERM", code)
	}
	if logs, _ := exec.Command("docker", "logs", name).CombinedOutput(); !strings.Contains(string(logs), "stopped cleanly") {
		t.Fatalf("the container's log does not say it stopped cleanly:\n%s", logs)
	}
}

// composeCmd is the compose tool installed: "docker compose" or
// "docker-compose" (nil: none).
func composeCmd() []string {
	if exec.Command("docker", "compose", "version").Run() == nil {
		return []string{"docker", "compose"}
	}
	if p, err := exec.LookPath("docker-compose"); err == nil {
		return []string{p}
	}
	return nil
}

// TestDocker_Compose brings up deploy/compose.yaml as shipped (the image
// built from deploy/Dockerfile, certificates made by stockd cert): three
// nodes on a private network. A sale through the published ports goes on
// while one container is killed and started again and another is cut off
// with docker network disconnect and reconnected; every buyer retries
// with the same request id until answered. Nothing is oversold or lost,
// and docker compose stop stops every node cleanly within the grace
// period.
func TestDocker_Compose(t *testing.T) {
	needDocker(t)
	compose := composeCmd()
	if compose == nil {
		t.Skip("neither docker compose nor docker-compose is installed")
	}
	tag := buildImage(t)
	bin := buildStockd(t, t.TempDir())
	certDir := t.TempDir()
	stockdCmd(t, bin, "cert", "ca", "-out", certDir)
	for _, n := range []string{"n1", "n2", "n3"} {
		stockdCmd(t, bin, "cert", "node", "-ca", certDir, "-id", n, "-host", n+",127.0.0.1", "-out", certDir)
	}
	entries, _ := os.ReadDir(certDir)
	for _, e := range entries {
		os.Chmod(filepath.Join(certDir, e.Name()), 0o644) // a test dir: readable by the image's user
	}
	os.Chmod(certDir, 0o755)
	project := "stockdtest" + randomSuffix(t)
	ports := map[string]string{}
	env := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"), "STOCKD_IMAGE=" + tag, "STOCKD_CERTS=" + certDir, "STOCKD_ADMIN_TOKEN=compose-admin"}
	for _, n := range []string{"n1", "n2", "n3"} {
		ports[n] = strings.TrimPrefix(freePort(t), "127.0.0.1:")
		env = append(env, "STOCKD_"+strings.ToUpper(n)+"_PORT="+ports[n])
	}
	file := filepath.Join(moduleDir(t), "deploy", "compose.yaml")
	run := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(compose[0], append(append(compose[1:], "-f", file, "-p", project), args...)...)
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s %s: %v\n%s", strings.Join(compose, " "), strings.Join(args, " "), err, out)
		}
		return strings.TrimSpace(string(out))
	}
	t.Cleanup(func() {
		cmd := exec.Command(compose[0], append(append(compose[1:], "-f", file, "-p", project), "down", "-v", "-t", "1")...)
		cmd.Env = env
		cmd.Run()
	})
	run("up", "-d")
	container := map[string]string{}
	for _, n := range []string{"n1", "n2", "n3"} {
		container[n] = run("ps", "-q", n)
		// What the node sees of the certificates: the CA's certificate and
		// its own pair, never the CA's key or the whole directory.
		out, err := exec.Command("docker", "inspect", "-f", `{{range .Mounts}}{{.Source}}:{{.Destination}} {{end}}`, container[n]).Output()
		if err != nil {
			t.Fatalf("docker inspect %s: %v", n, err)
		}
		var certs []string
		for _, m := range strings.Fields(string(out)) {
			if src, dst, _ := strings.Cut(m, ":"); strings.HasPrefix(src, certDir) {
				certs = append(certs, dst)
			}
		}
		slices.Sort(certs)
		if want := []string{"/certs/ca.pem", "/certs/" + n + "-key.pem", "/certs/" + n + ".pem"}; !slices.Equal(certs, want) {
			t.Fatalf("%s mounts %v of the certificates' directory, want %v", n, certs, want)
		}
		t.Logf("%s mounts %v", n, certs)
	}
	defer func() {
		if t.Failed() {
			for n, id := range container {
				out, _ := exec.Command("docker", "logs", "--tail", "30", id).CombinedOutput()
				t.Logf("--- %s's log:\n%s", n, out)
			}
		}
	}()
	clients := map[string]*fasthttp.HostClient{}
	for n, p := range ports {
		clients[n] = &fasthttp.HostClient{Addr: "127.0.0.1:" + p, ReadTimeout: 10 * time.Second, MaxConns: 16}
	}
	nodetest.WaitFor(t, 2*time.Minute, "three healthy containers", func() bool {
		for _, id := range container {
			if docker(t, "inspect", "-f", "{{.State.Health.Status}}", id) != "healthy" {
				return false
			}
		}
		return true
	})
	const units = 3000
	admin := func(c *fasthttp.HostClient, method, path, body string) int {
		req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
		defer fasthttp.ReleaseRequest(req)
		defer fasthttp.ReleaseResponse(resp)
		req.SetRequestURI("http://" + c.Addr + path)
		req.Header.SetMethod(method)
		req.Header.Set("Authorization", "Bearer compose-admin")
		req.SetBodyString(body)
		if err := c.Do(req, resp); err != nil {
			return 0
		}
		return resp.StatusCode()
	}
	if code := admin(clients["n1"], "PUT", "/v1/skus/cmp", fmt.Sprintf(`{"total":%d}`, units)); code != 201 {
		t.Fatalf("create the sale: %d", code)
	}

	// Buyers on all three published ports; each retries with its request
	// id until it gets a definite answer.
	var wins, losses atomic.Int64
	var mu sync.Mutex
	orders := map[string]bool{}
	var next atomic.Int64
	var wg sync.WaitGroup
	stopBuying := time.Now().Add(3 * time.Minute)
	for w := range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			names := []string{"n1", "n2", "n3"}
			for time.Now().Before(stopBuying) && wins.Load() < units {
				b := next.Add(1)
				body := fmt.Sprintf(`{"user":"u%d","request_id":"r%d"}`, b, b)
				for try := 0; time.Now().Before(stopBuying); try++ {
					code, out := nodetest.CallQuiet(clients[names[(w+try)%3]], "POST", "/v1/skus/cmp/deduct", body)
					if code == 200 {
						mu.Lock()
						if orders[out["order_id"].(string)] {
							mu.Unlock()
							t.Errorf("order %v answered to two buyers", out["order_id"])
							return
						}
						orders[out["order_id"].(string)] = true
						mu.Unlock()
						wins.Add(1)
						break
					}
					if code == 409 && out["error"] == "sold_out" {
						losses.Add(1)
						break
					}
					time.Sleep(50 * time.Millisecond) // a retry's pause, not synchronisation
				}
			}
		}()
	}
	nodetest.WaitFor(t, time.Minute, "300 wins", func() bool { return wins.Load() >= 300 })
	docker(t, "kill", container["n2"])
	t.Logf("docker kill n2 at %d wins", wins.Load())
	nodetest.WaitFor(t, time.Minute, "wins while n2 is down", func() bool { return wins.Load() >= 800 })
	docker(t, "start", container["n2"])
	t.Logf("docker start n2 at %d wins", wins.Load())
	network := project + "_stockd"
	docker(t, "network", "disconnect", network, container["n3"])
	t.Logf("n3 cut off at %d wins", wins.Load())
	nodetest.WaitFor(t, time.Minute, "wins while n3 is cut off", func() bool { return wins.Load() >= 1500 })
	docker(t, "network", "connect", "--alias", "n3", network, container["n3"])
	t.Logf("n3 reconnected at %d wins", wins.Load())
	wg.Wait()
	t.Logf("the sale ended: %d wins, %d sold_out answers", wins.Load(), losses.Load())
	if wins.Load() != units {
		t.Fatalf("%d wins answered for %d units", wins.Load(), units)
	}
	for _, n := range []string{"n1", "n2", "n3"} {
		nodetest.WaitFor(t, time.Minute, n+" caught up with the sale", func() bool {
			_, a := nodetest.CallQuiet(clients[n], "GET", "/v1/skus/cmp/audit", "")
			return a != nil && a["ok"] == true && a["sold"] == float64(units)
		})
		nodetest.CheckLedger(t, clients[n], "cmp")
	}

	start := time.Now()
	run("stop")
	took := time.Since(start)
	if took > 12*time.Second { // the drain timeout is 10 s
		t.Fatalf("docker compose stop took %s, past the drain timeout", took)
	}
	t.Logf("docker compose stop: %s", took.Round(time.Millisecond))
	for n, id := range container {
		if code := docker(t, "inspect", "-f", "{{.State.ExitCode}}", id); code != "0" {
			t.Fatalf("%s exited with %s on stop", n, code)
		}
	}
}
