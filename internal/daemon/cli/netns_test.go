package cli_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/internal/config"
	"github.com/pegaflow/pegad/internal/testutil"
	"github.com/pegaflow/pegad/internal/testutil/cluster"
)

// TestMain lets cluster.StartProcess run pegad as this test binary,
// re-executed: the netns and notify tests run real pegad processes
// without a build.
func TestMain(m *testing.M) {
	cluster.RunPegadIfChild()
	os.Exit(m.Run())
}

// netnsPair is two network namespaces joined by a veth pair on a private
// subnet that exists only inside them.
type netnsPair struct {
	ns   [2]string
	addr [2]string
}

func newNetnsPair(t *testing.T) *netnsPair {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("SKIP: needs root for network namespaces")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("SKIP: iproute2 (ip) not found")
	}
	var b [3]byte
	_, _ = rand.Read(b[:])
	suffix := hex.EncodeToString(b[:])
	p := &netnsPair{
		ns:   [2]string{"operator-" + suffix + "-a", "operator-" + suffix + "-b"},
		addr: [2]string{"10.219.7.1", "10.219.7.2"},
	}
	veth := [2]string{"opr" + suffix + "a", "opr" + suffix + "b"} // <= 15 bytes
	ip := func(args ...string) error {
		out, err := exec.Command("ip", args...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
		return nil
	}
	if err := ip("netns", "add", p.ns[0]); err != nil {
		t.Skipf("SKIP: network namespaces unavailable: %v", err)
	}
	t.Cleanup(func() { _ = ip("netns", "del", p.ns[0]) })
	if err := ip("netns", "add", p.ns[1]); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ip("netns", "del", p.ns[1]) }) // takes the veth pair with it
	if err := ip("link", "add", veth[0], "type", "veth", "peer", "name", veth[1]); err != nil {
		t.Skipf("SKIP: veth unavailable: %v", err)
	}
	for i := range 2 {
		for _, args := range [][]string{
			{"link", "set", veth[i], "netns", p.ns[i]},
			{"-n", p.ns[i], "addr", "add", p.addr[i] + "/24", "dev", veth[i]},
			{"-n", p.ns[i], "link", "set", veth[i], "up"},
			{"-n", p.ns[i], "link", "set", "lo", "up"},
		} {
			if err := ip(args...); err != nil {
				t.Fatal(err)
			}
		}
	}
	return p
}

// startPegad runs pegad (this test binary re-executed) in namespace ns
// with flags over cluster's loopback config (less its tcp-data-listen)
// and returns it; its local clients work from here (the socket is a file).
func startPegad(t *testing.T, ns, name string, flags ...string) *cluster.Node {
	t.Helper()
	n := cluster.StartProcess(t, cluster.Named(name), cluster.InNetns(ns),
		cluster.WithConfig(func(c *config.Config) { c.TCPDataListen = config.Default().TCPDataListen }),
		cluster.WithArgs(flags...))
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("pegad in %s:\n%s", ns, n.Logs)
		}
	})
	return n
}

// TestTCPAcrossNamespaces: two pegads on two "hosts" (network namespaces)
// prefetch over the tcp transport given only --listen and --advertise (no
// --tcp-data-listen): the data listener follows --listen and advertises a
// dialable address, and the data addresses are logged at start.
func TestTCPAcrossNamespaces(t *testing.T) {
	if testing.Short() {
		t.Skip("SKIP: -short")
	}
	p := newNetnsPair(t)
	common := []string{"--transport", "tcp", "--pool-size", "16MiB", "--log-format", "json", "--lock-timeout", "10s"}
	na := startPegad(t, p.ns[0], "a", append([]string{"--listen", "0.0.0.0:50055", "--advertise", p.addr[0] + ":50055"}, common...)...)
	nb := startPegad(t, p.ns[1], "b", append([]string{"--listen", p.addr[1] + ":50055", "--advertise", p.addr[1] + ":50055"}, common...)...)
	a, b := na.Local, nb.Local
	logs := [2]*testutil.LogBuffer{na.Logs, nb.Logs}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	body := bytes.Repeat([]byte("pegad-netns-"), 20000)
	hash := []byte("operator-netns-block")
	if _, err := testutil.PutBlock(ctx, a, "ns", hash, body, true); err != nil {
		t.Fatal(err)
	}
	resp, err := b.Prefetch(ctx, &pegadv1.PrefetchRequest{Peer: p.addr[0] + ":50055", Namespace: "ns", Hashes: [][]byte{hash}})
	if err != nil {
		t.Fatalf("prefetch: %v", err)
	}
	if len(resp.Blocks) != 1 || resp.Blocks[0].Status != pegadv1.PrefetchBlockStatus_PREFETCH_BLOCK_STATUS_FETCHED {
		t.Fatalf("prefetch result: %v", resp.Blocks)
	}
	got, err := testutil.GetBlock(ctx, b, "ns", hash)
	if err != nil || !bytes.Equal(got, body) {
		t.Fatalf("fetched block differs (%d bytes, %v)", len(got), err)
	}
	for i, want := range []string{`"data_addrs":["` + p.addr[0] + `:`, `"data_addrs":["` + p.addr[1] + `:`} {
		if !strings.Contains(logs[i].String(), want) {
			t.Errorf("pegad %d did not log its data address (%s):\n%s", i, want, logs[i].String())
		}
	}
}
