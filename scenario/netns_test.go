package scenario

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// hostNet is a private network of hosts, one network namespace each,
// joined by a bridge the test creates (and removes): every host has its
// own non-loopback address, and the test process reaches them all.
type hostNet struct {
	t      *testing.T
	bridge string
	addrs  map[string]string // host -> its address
	ns     map[string]string // host -> its namespace
	veth   map[string]string // host -> its link's end on the bridge
}

// run runs a command that sets up or tears down the network.
func (h *hostNet) run(args ...string) error {
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

func (h *hostNet) must(args ...string) {
	h.t.Helper()
	if err := h.run(args...); err != nil {
		h.t.Fatal(err)
	}
}

// newHostNet makes one namespace per id on a bridge, or skips the test,
// saying why, where namespaces cannot be made (not root, no ip command).
func newHostNet(t *testing.T, ids ...string) *hostNet {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to create network namespaces (CI runs it as root)")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs the ip command (iproute2) to create network namespaces")
	}
	tag := os.Getpid() % 10000
	subnet := fmt.Sprintf("10.213.%d", tag%250)
	h := &hostNet{t: t, bridge: fmt.Sprintf("stkbr%d", tag), addrs: map[string]string{}, ns: map[string]string{}, veth: map[string]string{}}
	t.Cleanup(h.remove)
	if err := h.run("ip", "link", "add", h.bridge, "type", "bridge"); err != nil {
		t.Skipf("cannot create a bridge here: %v", err)
	}
	h.must("ip", "addr", "add", subnet+".1/24", "dev", h.bridge)
	h.must("ip", "link", "set", h.bridge, "up")
	// Docker's FORWARD policy drops bridged traffic when br_netfilter is
	// on: let this bridge's own traffic through while the test runs.
	if _, err := exec.LookPath("iptables"); err == nil {
		h.must("iptables", "-I", "FORWARD", "-i", h.bridge, "-o", h.bridge, "-j", "ACCEPT")
	}
	for i, id := range ids {
		ns, hostEnd := fmt.Sprintf("stockd%d-%s", tag, id), fmt.Sprintf("stkv%d%s", tag, id)
		addr := fmt.Sprintf("%s.%d", subnet, 11+i)
		h.must("ip", "netns", "add", ns)
		h.ns[id] = ns
		h.must("ip", "link", "add", hostEnd, "type", "veth", "peer", "name", "eth0", "netns", ns)
		h.veth[id] = hostEnd
		h.must("ip", "link", "set", hostEnd, "master", h.bridge, "up")
		h.must("ip", "-n", ns, "addr", "add", addr+"/24", "dev", "eth0")
		h.must("ip", "-n", ns, "link", "set", "eth0", "up")
		h.must("ip", "-n", ns, "link", "set", "lo", "up")
		h.addrs[id] = addr
	}
	return h
}

// cut takes host id off the network (its link down); heal brings it back.
func (h *hostNet) cut(id string)  { h.must("ip", "link", "set", h.veth[id], "down") }
func (h *hostNet) heal(id string) { h.must("ip", "link", "set", h.veth[id], "up") }

// remove deletes what newHostNet made (each step tolerates its absence).
func (h *hostNet) remove() {
	for _, ns := range h.ns {
		h.run("ip", "netns", "del", ns) // takes its veth pair along
	}
	if _, err := exec.LookPath("iptables"); err == nil {
		h.run("iptables", "-D", "FORWARD", "-i", h.bridge, "-o", h.bridge, "-j", "ACCEPT")
	}
	h.run("ip", "link", "del", h.bridge)
}
