package scenario

import (
	"crypto/tls"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"stockd.dev/stockd/client"

	"github.com/valyala/fasthttp"

	"stockd.dev/stockd/internal/certs"
	"stockd.dev/stockd/node/nodetest"
)

// procSecurity runs a procCluster on node certificates and HTTPS made by
// `stockd cert` (or by openssl, for the nodes in openssl), each node
// optionally on its own host address in its own network namespace.
type procSecurity struct {
	dir string // ca.pem, <id>.pem, <id>-key.pem, client.pem ...
	// hosts and netns, when set, give each node its address and the
	// network namespace it runs in.
	hosts, netns map[string]string
	// clientCA runs every node with -http-client-ca: the test's clients
	// then present client.pem.
	clientCA bool
	// extra are added to one node's command line (not to the others').
	extra map[string][]string
}

func (s *procSecurity) host(id string) string {
	if s == nil {
		return ""
	}
	return s.hosts[id]
}

// nodeArgs are node id's security flags: node certificates and HTTPS, or
// without sec the loopback cluster secret.
func (s *procSecurity) nodeArgs(id string) []string {
	if s == nil {
		return []string{"-cluster-secret", "multiproc-secret"}
	}
	cert, key := filepath.Join(s.dir, id+".pem"), filepath.Join(s.dir, id+"-key.pem")
	args := []string{"-node-cert", cert, "-node-key", key, "-node-ca", filepath.Join(s.dir, "ca.pem"),
		"-http-cert", cert, "-http-key", key}
	if s.clientCA {
		args = append(args, "-http-client-ca", filepath.Join(s.dir, "ca.pem"))
	}
	if s.hosts != nil {
		args = append(args, "-admin-token", testAdminToken)
	}
	return append(args, s.extra[id]...)
}

// command runs bin for node id, in its namespace when it has one.
func (s *procSecurity) command(id, bin string, args ...string) *exec.Cmd {
	if s != nil && s.netns[id] != "" {
		return exec.Command("ip", append([]string{"netns", "exec", s.netns[id], bin}, args...)...)
	}
	return exec.Command(bin, args...)
}

// client is the test's HTTP client of the node at addr: HTTPS checked
// against the cluster's CA (and a client certificate) under sec.
func (s *procSecurity) client(addr string) *fasthttp.HostClient {
	c := &fasthttp.HostClient{Addr: addr, MaxConns: 32, ReadTimeout: 15 * time.Second}
	if s != nil {
		c.IsTLS, c.TLSConfig = true, s.clientTLS(addr)
	}
	return c
}

func (s *procSecurity) clientTLS(addr string) *tls.Config {
	var cert, key string
	if s.clientCA {
		cert, key = filepath.Join(s.dir, "client.pem"), filepath.Join(s.dir, "client-key.pem")
	}
	cfg, err := client.TLSFiles(filepath.Join(s.dir, "ca.pem"), cert, key)
	if err != nil {
		panic("the test cluster's certificates do not load: " + err.Error())
	}
	cfg.ServerName = certs.ServerName(addr)
	return cfg
}

// makeCerts writes a CA, a node certificate for each of ids (SANs: its
// host under hosts, and loopback) and a client certificate into dir with
// `stockd cert`.
func makeCerts(t *testing.T, bin, dir string, ids []string, hosts map[string]string) {
	t.Helper()
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command(bin, append([]string{"cert"}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("stockd cert %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	run("ca", "-out", dir)
	for _, id := range ids {
		names := "127.0.0.1,localhost"
		if h := hosts[id]; h != "" {
			names = h + "," + names
		}
		run("node", "-ca", dir, "-id", id, "-host", names, "-out", dir)
	}
	run("client", "-ca", dir, "-name", "client", "-out", dir)
}

// secureCluster builds stockd, makes certificates for n1..n3 (unless
// prepare made them) and starts the three nodes on them.
func secureCluster(t *testing.T, prepare func(t *testing.T, bin string, sec *procSecurity), extraArgs ...string) (*procCluster, *procSecurity, string) {
	t.Helper()
	dir := t.TempDir()
	bin := buildStockd(t, dir)
	sec := &procSecurity{dir: filepath.Join(dir, "certs")}
	if prepare != nil {
		prepare(t, bin, sec)
	}
	if _, err := os.Stat(filepath.Join(sec.dir, "ca.pem")); err != nil {
		makeCerts(t, bin, sec.dir, []string{"n1", "n2", "n3"}, sec.hosts)
	}
	return startProcClusterSecured(t, bin, sec, extraArgs...), sec, bin
}

// testAdminToken is the admin token of nodes on their own hosts.
const testAdminToken = "test-admin-token"

// adminCall is a call with the admin token.
func adminCall(t *testing.T, c *fasthttp.HostClient, method, path, body string) int {
	t.Helper()
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(nodetest.URL(c, path))
	req.Header.SetMethod(method)
	req.Header.Set("Authorization", "Bearer "+testAdminToken)
	req.SetBodyString(body)
	if err := c.DoTimeout(req, resp, 15*time.Second); err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	return resp.StatusCode()
}
