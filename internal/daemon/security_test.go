package daemon_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/user"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/rs/zerolog"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/internal/daemon"
	"github.com/pegaflow/pegad/internal/localdata"
	"github.com/pegaflow/pegad/internal/peertls"
	"github.com/pegaflow/pegad/internal/testutil"
)

// TestSocketGroup: --socket-group hands the socket to that group at mode
// 0660; an unknown group stops the start.
func TestSocketGroup(t *testing.T) {
	g, err := user.LookupGroupId(strconv.Itoa(os.Getgid()))
	if err != nil {
		t.Skipf("no name for gid %d: %v", os.Getgid(), err)
	}
	cfg := testConfig(t)
	cfg.SocketGroup = g.Name
	n := startNode(t, cfg)
	for _, p := range []string{n.d.SocketPath(), localdata.SocketPath(n.d.SocketPath())} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if st := fi.Sys().(*syscall.Stat_t); fi.Mode().Perm() != daemon.SocketMode || int(st.Gid) != os.Getgid() {
			t.Fatalf("%s: mode %v gid %d, want %v gid %d", p, fi.Mode().Perm(), st.Gid, os.FileMode(daemon.SocketMode), os.Getgid())
		}
	}

	// A number is a gid even when /etc/group has no name for it (a
	// container image): here our own gid, which we may chown to.
	if _, err := user.LookupGroup(strconv.Itoa(os.Getgid())); err == nil {
		t.Logf("a group is named %d: the numeric case is not reached", os.Getgid())
	}
	cfg = testConfig(t)
	cfg.SocketGroup = strconv.Itoa(os.Getgid())
	n = startNode(t, cfg)
	if fi, err := os.Stat(n.d.SocketPath()); err != nil || int(fi.Sys().(*syscall.Stat_t).Gid) != os.Getgid() {
		t.Fatalf("numeric socket-group: %v %v", fi, err)
	}

	cfg = testConfig(t)
	cfg.SocketGroup = "pegad-no-such-group-" + strconv.Itoa(os.Getpid())
	_, err = daemon.Start(context.Background(), cfg, daemon.WithLogger(zerolog.Nop()), daemon.WithNotify(func(string) {}))
	var unknown user.UnknownGroupError
	if !errors.As(err, &unknown) || !strings.Contains(err.Error(), "socket-group") {
		t.Fatalf("unknown group: %v, want a socket-group error wrapping user.UnknownGroupError", err)
	}
}

// TestPlaintextWarningLoopbackStart: a real start on loopback stays quiet
// (the cases by address: TestPlaintextWarning).
func TestPlaintextWarningLoopbackStart(t *testing.T) {
	const warning = "Peer port is plaintext on a non-loopback address"
	n := startNode(t, testConfig(t))
	if strings.Contains(n.logs.String(), warning) {
		t.Fatalf("loopback peer port warned:\n%s", n.logs)
	}
}

// TestTLSStartErrors: bad or partial TLS files stop the start with an
// error saying which.
func TestTLSStartErrors(t *testing.T) {
	ca, other := testutil.NewCA(t, "ca"), testutil.NewCA(t, "other")
	f := ca.Issue(t, t.TempDir(), testutil.CertSpec{DNS: []string{"n"}})
	cfg := testConfig(t)
	cfg.PeerTLSCert, cfg.PeerTLSKey, cfg.PeerTLSCA = f.Cert, f.Key, other.WriteCA(t, t.TempDir())
	_, err := daemon.Start(context.Background(), cfg, daemon.WithLogger(zerolog.Nop()), daemon.WithNotify(func(string) {}))
	if !errors.Is(err, peertls.ErrBadFiles) {
		t.Fatalf("certificate of another CA: %v, want ErrBadFiles", err)
	}
	cfg.PeerTLSCA = ""
	if _, err := daemon.Start(context.Background(), cfg, daemon.WithLogger(zerolog.Nop()), daemon.WithNotify(func(string) {})); err == nil ||
		!strings.Contains(err.Error(), "peer-tls") {
		t.Fatalf("partial TLS files: %v", err)
	}
}

// TestDeleteLogsCaller: deleting a block is logged with the caller's uid,
// gid and pid as the kernel reports them (SO_PEERCRED), not as claimed.
func TestDeleteLogsCaller(t *testing.T) {
	n := startNode(t, testConfig(t))
	putBlock(t, n, "ns", []byte("h"), []byte("body"), false)
	if _, err := n.local.DeleteBlock(ctxT(t), &pegadv1.DeleteBlockRequest{Namespace: "ns", Hash: []byte("h")}); err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf(`"uid":%d,"gid":%d,"pid":%d`, os.Getuid(), os.Getgid(), os.Getpid())
	for _, l := range strings.Split(n.logs.String(), "\n") {
		if strings.Contains(l, "Block deleted") {
			if !strings.Contains(l, want) {
				t.Fatalf("delete log line %q lacks %s", l, want)
			}
			return
		}
	}
	t.Fatalf("no delete log line:\n%s", n.logs)
}

// TestNodeIDNotInCertWarned: a node id its own certificate does not prove
// would be refused by every peer; the start says so.
func TestNodeIDNotInCertWarned(t *testing.T) {
	const warning = "node-id is not one of this node's certificate identities"
	ca := testutil.NewCA(t, "ca")
	for _, c := range []struct {
		nodeID string
		warn   bool
	}{{"gpu-1", false}, {"gpu-2", true}} {
		f := ca.Issue(t, t.TempDir(), testutil.CertSpec{DNS: []string{"gpu-1"}})
		cfg := testConfig(t)
		cfg.NodeID = c.nodeID
		cfg.PeerTLSCert, cfg.PeerTLSKey, cfg.PeerTLSCA = f.Cert, f.Key, f.CA
		n := startNode(t, cfg)
		if got := strings.Contains(n.logs.String(), warning); got != c.warn {
			t.Errorf("node-id %s: warned %v, want %v", c.nodeID, got, c.warn)
		}
	}
}

// TestOwnIdentityOffAllowList: the start-up self-check dials the peer port
// as a peer; an allow-list that leaves out this node itself (which its
// peers' lists would too) stops the start with an error that says so.
func TestOwnIdentityOffAllowList(t *testing.T) {
	ca := testutil.NewCA(t, "ca")
	f := ca.Issue(t, t.TempDir(), testutil.CertSpec{DNS: []string{"gpu-1"}})
	cfg := testConfig(t)
	cfg.NodeID = "gpu-1"
	cfg.PeerTLSCert, cfg.PeerTLSKey, cfg.PeerTLSCA = f.Cert, f.Key, f.CA
	cfg.PeerAllow = "cpu-*"
	_, err := daemon.Start(context.Background(), cfg, daemon.WithLogger(zerolog.Nop()), daemon.WithNotify(func(string) {}))
	if err == nil || !strings.Contains(err.Error(), "--peer-allow") {
		t.Fatalf("start with its own identity off --peer-allow: %v", err)
	}
	cfg.PeerAllow = "cpu-*,gpu-*"
	startNode(t, cfg)
}
