package cli

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/internal/testutil"
)

// childArgsEnv carries pegad's argv (unit-separated) to a re-executed test
// binary, so that the netns test runs real pegad processes without a build.
const childArgsEnv = "PEGAD_TEST_CHILD_ARGS"

func TestMain(m *testing.M) {
	if a, ok := os.LookupEnv(childArgsEnv); ok {
		os.Args = append([]string{"pegad"}, strings.Split(a, "\x1f")...)
		os.Exit(Main())
	}
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

// startPegad runs pegad (this test binary re-executed) in namespace ns and
// returns a local-API client on its socket (a file: reachable from here).
func startPegad(t *testing.T, ns, sock string, logs *testutil.LogBuffer, args ...string) pegadv1.LocalServiceClient {
	t.Helper()
	cmd := exec.Command("ip", "netns", "exec", ns, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childArgsEnv+"="+strings.Join(args, "\x1f"), "PEGAD_CONFIG=")
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("pegad in %s:\n%s", ns, logs.String())
		}
	})
	cc, err := grpc.NewClient("passthrough:///pegad",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", sock)
		}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	c := pegadv1.NewLocalServiceClient(cc)
	deadline := time.Now().Add(20 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := c.ListBlocks(ctx, &pegadv1.ListBlocksRequest{})
		cancel()
		if err == nil {
			return c
		}
		if time.Now().After(deadline) {
			t.Fatalf("pegad in %s not ready: %v\n%s", ns, err, logs.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
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
	dir := t.TempDir()
	var logs [2]testutil.LogBuffer
	common := []string{"--transport", "tcp", "--pool-size", "16MiB", "--log-format", "json", "--lock-timeout", "10s"}
	sockA, sockB := filepath.Join(dir, "a.sock"), filepath.Join(dir, "b.sock")
	a := startPegad(t, p.ns[0], sockA, &logs[0], append([]string{"--node-id", "a", "--socket", sockA,
		"--listen", "0.0.0.0:50055", "--advertise", p.addr[0] + ":50055"}, common...)...)
	b := startPegad(t, p.ns[1], sockB, &logs[1], append([]string{"--node-id", "b", "--socket", sockB,
		"--listen", p.addr[1] + ":50055", "--advertise", p.addr[1] + ":50055"}, common...)...)

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
