package reliability

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// runID prefixes every namespace this process creates: rl<pid>-<random>.
// The pid lets a later run tell a stale namespace (its creator is gone)
// from one another live run is using.
var runID = fmt.Sprintf("rl%d-%04x", os.Getpid(), rand.N(1<<16))

// staleNS matches the names runID produces.
var staleNS = regexp.MustCompile(`^rl([0-9]+)-[0-9a-f]{4}-`)

// command runs name args and returns its combined output in the error.
func command(name string, args ...string) error {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}

// netnsSupport says why namespaces cannot be used here ("" when they can):
// root, ip, a namespace with a veth pair to a bridge, and tbf.
func netnsSupport() string {
	if os.Geteuid() != 0 {
		return "needs root (network namespaces, veth, tc)"
	}
	for _, tool := range []string{"ip", "tc"} {
		if _, err := exec.LookPath(tool); err != nil {
			return tool + " not found"
		}
	}
	name := runID + "-probe"
	if err := command("ip", "netns", "add", name); err != nil {
		return err.Error()
	}
	defer command("ip", "netns", "del", name) //nolint:errcheck // best effort, the probe namespace is empty
	for _, args := range [][]string{
		{"ip", "netns", "exec", name, "true"}, // how the daemons are started
		{"ip", "-n", name, "link", "add", "br0", "type", "bridge"},
		{"ip", "-n", name, "link", "add", "va", "type", "veth", "peer", "name", "vb"},
		{"tc", "-n", name, "qdisc", "add", "dev", "va", "root", "tbf", "rate", "40mbit", "burst", "32kbit", "latency", "200ms"},
		{"tc", "-n", name, "qdisc", "add", "dev", "vb", "ingress"},
	} {
		if err := command(args[0], args[1:]...); err != nil {
			return err.Error()
		}
	}
	return ""
}

// netemSupported reports whether the kernel has sch_netem (often not built
// in minimal kernels; then delay and loss come from a userspace delay line).
func netemSupported() bool {
	name := runID + "-netem"
	if command("ip", "netns", "add", name) != nil {
		return false
	}
	defer command("ip", "netns", "del", name) //nolint:errcheck // best effort
	return command("ip", "-n", name, "link", "add", "va", "type", "veth", "peer", "name", "vb") == nil &&
		command("tc", "-n", name, "qdisc", "add", "dev", "va", "root", "netem", "delay", "1ms") == nil
}

// sweepStale deletes namespaces an earlier run of this suite left behind
// (killed before its cleanup): rl<pid>-... whose pid is no longer alive.
func sweepStale() (removed []string) {
	ents, _ := os.ReadDir("/run/netns")
	for _, e := range ents {
		m := staleNS.FindStringSubmatch(e.Name())
		if m == nil {
			continue
		}
		pid, _ := strconv.Atoi(m[1])
		if pid == os.Getpid() {
			continue
		}
		if _, err := os.Stat(filepath.Join("/proc", m[1])); err == nil {
			continue
		}
		if command("ip", "netns", "del", e.Name()) == nil {
			removed = append(removed, e.Name())
		}
	}
	return removed
}

// network is one scenario's hosts: a switch namespace with a bridge, and
// one namespace per host joined to it by a veth pair (eth0 inside the
// host, p-<host> on the bridge), all on 10.231.<subnet>.0/24. Faults act on a
// host's eth0, so they affect its traffic with every other host.
type network struct {
	subnet int // hosts are 10.231.<subnet>.<i>: unique per scenario of a run
	prefix string
	sw     string
	hosts  map[string]*netns
}

// netns is one host's namespace.
type netns struct {
	name string
	ip   string
}

func newNetwork(t testing.TB, subnet int) *network {
	t.Helper()
	n := &network{subnet: subnet, prefix: fmt.Sprintf("%s-%02d", runID, subnet), hosts: map[string]*netns{}}
	n.sw = n.prefix + "-sw"
	t.Cleanup(n.remove)
	if err := command("ip", "netns", "add", n.sw); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"-n", n.sw, "link", "add", "br0", "type", "bridge"},
		{"-n", n.sw, "link", "set", "br0", "up"},
	} {
		if err := command("ip", args...); err != nil {
			t.Fatal(err)
		}
	}
	return n
}

// addHost creates host name with address 10.231.<subnet>.<index+1>.
func (n *network) addHost(t testing.TB, name string) *netns {
	t.Helper()
	h := &netns{name: n.prefix + "-" + name, ip: fmt.Sprintf("10.231.%d.%d", n.subnet, len(n.hosts)+1)}
	if err := command("ip", "netns", "add", h.name); err != nil {
		t.Fatal(err)
	}
	n.hosts[name] = h
	port := "p-" + name
	for _, args := range [][]string{
		{"-n", h.name, "link", "set", "lo", "up"},
		{"-n", n.sw, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", h.name},
		{"-n", n.sw, "link", "set", port, "master", "br0"},
		{"-n", n.sw, "link", "set", port, "up"},
		{"-n", h.name, "addr", "add", h.ip + "/24", "dev", "eth0"},
		{"-n", h.name, "link", "set", "eth0", "up"},
	} {
		if err := command("ip", args...); err != nil {
			t.Fatal(err)
		}
	}
	return h
}

// remove deletes every namespace of n (qdiscs and veths go with them).
func (n *network) remove() {
	for _, h := range n.hosts {
		command("ip", "netns", "del", h.name) //nolint:errcheck // reported below
	}
	command("ip", "netns", "del", n.sw) //nolint:errcheck // reported below
}

// leftover lists namespaces of this process still present (a cleanup bug).
func leftover() []string {
	var out []string
	ents, _ := os.ReadDir("/run/netns")
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), runID) {
			out = append(out, e.Name())
		}
	}
	return out
}

// Faults on a host's link.

func (h *netns) linkDown() error { return command("ip", "-n", h.name, "link", "set", "eth0", "down") }
func (h *netns) linkUp() error   { return command("ip", "-n", h.name, "link", "set", "eth0", "up") }

// slow makes h's egress a rate bottleneck; the small burst also makes tbf
// cut GSO super-packets into MTU-sized ones.
func (h *netns) slow(rate string) error {
	return command("tc", "-n", h.name, "qdisc", "replace", "dev", "eth0", "root", "tbf", "rate", rate, "burst", "32kbit", "latency", "400ms")
}

func (h *netns) unshape() error {
	err := command("tc", "-n", h.name, "qdisc", "del", "dev", "eth0", "root")
	if err != nil && strings.Contains(err.Error(), "Cannot delete qdisc with handle of zero") {
		return nil // nothing installed
	}
	return err
}

// netem installs a netem qdisc on h's egress (spec: "delay 50ms loss 5%").
func (h *netns) netem(spec ...string) error {
	return command("tc", append([]string{"-n", h.name, "qdisc", "replace", "dev", "eth0", "root", "netem"}, spec...)...)
}

// blackholeFrom drops every TCP segment h receives from source ports
// lo..hi (classic BPF on ingress; cls_bpf shows a classic program the
// frame from its 14-byte Ethernet header on):
// a peer's data ports go silent while its gRPC port still answers.
func (h *netns) blackholeFrom(lo, hi int) error {
	if err := command("tc", "-n", h.name, "qdisc", "add", "dev", "eth0", "ingress"); err != nil {
		return err
	}
	return command("tc", "-n", h.name, "filter", "add", "dev", "eth0", "parent", "ffff:", "bpf", "da", "bytecode",
		fmt.Sprintf("8,48 0 0 23,21 0 5 6,177 0 0 14,72 0 0 14,53 0 2 %d,37 1 0 %d,6 0 0 2,6 0 0 0", lo, hi))
}

// unfilter removes blackholeFrom's filter.
func (h *netns) unfilter() error {
	return command("tc", "-n", h.name, "qdisc", "del", "dev", "eth0", "ingress")
}

// dial connects from inside h's namespace: a goroutine locked to its own
// OS thread enters the namespace and creates the socket there. The thread
// is never unlocked, so it exits with the goroutine and no other goroutine
// ever runs in the wrong namespace. h == nil dials from the current one.
func (h *netns) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	if h == nil {
		return d.DialContext(ctx, network, addr)
	}
	type result struct {
		c   net.Conn
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		f, err := os.Open(filepath.Join("/run/netns", h.name))
		if err != nil {
			ch <- result{err: err}
			return
		}
		err = unix.Setns(int(f.Fd()), unix.CLONE_NEWNET)
		f.Close()
		if err != nil {
			ch <- result{err: fmt.Errorf("setns %s: %w", h.name, err)}
			return
		}
		c, err := d.DialContext(ctx, network, addr)
		ch <- result{c, err}
	}()
	r := <-ch
	if r.err != nil && errors.Is(r.err, context.Canceled) {
		return nil, r.err
	}
	return r.c, r.err
}
