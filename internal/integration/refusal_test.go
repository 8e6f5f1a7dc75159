package integration

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/pegaflow/pegad/internal/ctl"
	"github.com/pegaflow/pegad/internal/testutil"
)

// TestCertRefusalNotRetried (issue 23): a requester whose certificate the
// holder refuses (a rogue CA; a valid one off --peer-allow) gets pegactl's
// permission exit (5) with a message naming the certificate problem, not
// the retryable "connection broken" (4); it counts the failure as class
// authentication; and it stops dialling the holder: further prefetches and
// seconds of waiting add no handshake for the holder to refuse, until a
// certificate reload (SIGHUP) lets it try again.
func TestCertRefusalNotRetried(t *testing.T) {
	const ns = "refused"
	ca, rogue := testutil.NewCA(t, "cluster"), testutil.NewCA(t, "rogue")
	hc, _ := tlsConfig(t, ca, "node-h", "node-*")
	h := start(t, hc)
	blocks := randomBlocks(rand.New(rand.NewPCG(23, 4)), "b", 1, 1, 64<<10)
	putAll(t, h, ns, blocks)
	hash := fmt.Sprintf("%x", blocks[0].hash)
	handshakes := func() float64 {
		return h.cn.Scrape(t)[`pegaflow_peer_auth_refused_total{reason="tls_handshake"}`]
	}

	xc := baseConfig(t, "node-x")
	xf := rogue.Issue(t, t.TempDir(), testutil.CertSpec{DNS: []string{"node-x"}})
	xc.PeerTLSCert, xc.PeerTLSKey, xc.PeerTLSCA = xf.Cert, xf.Key, xf.CA
	x := start(t, xc)
	prefetchCtl := func(n *node) (string, int) {
		_, stderr, code := runPegactl(n.d.SocketPath(), "prefetch", "--peer", h.d.PeerAddr(), "--namespace", ns, hash)
		return stderr, code
	}
	stderr, code := prefetchCtl(x)
	// Which side refuses first depends on the CA each trusts: here the
	// requester's own (rogue) CA does not know the holder's certificate.
	if code != ctl.ExitPermission || !strings.Contains(stderr, "refused the peer's certificate") ||
		strings.Contains(stderr, "connection broken") {
		t.Fatalf("rogue-CA prefetch: exit %d, %q; want %d naming the refused certificate", code, stderr, ctl.ExitPermission)
	}
	eventually(t, "the holder counts the refused handshake", 20*time.Second, func() error {
		if n := handshakes(); n < 1 {
			return fmt.Errorf("%v refused handshakes", n)
		}
		return nil
	})
	first := handshakes()
	for range 2 {
		if stderr, code := prefetchCtl(x); code != ctl.ExitPermission || !strings.Contains(stderr, "not redialling") {
			t.Fatalf("prefetch in the refusal backoff: exit %d, %q; want %d saying it does not redial", code, stderr, ctl.ExitPermission)
		}
	}
	time.Sleep(3 * time.Second) // gRPC's reconnect backoff starts at 1 s
	if n := handshakes(); n != first {
		t.Fatalf("the refused requester kept dialling: %v refused handshakes, %v after its first prefetch", n, first)
	}
	if m := x.cn.Scrape(t); m[`pegaflow_rdma_fetch_errors_total{class="authentication"}`] < 3 {
		t.Errorf("fetch errors of class authentication = %v, want >= 3", m[`pegaflow_rdma_fetch_errors_total{class="authentication"}`])
	}
	if got := strings.Count(x.logs.String(), "Peer certificate refused"); got != 1 {
		t.Errorf("%d \"Peer certificate refused\" lines on the requester, want 1:\n%s", got, x.logs)
	}

	// A reload (what SIGHUP does) is the operator's way to try again.
	if err := x.d.ReloadTLS(); err != nil {
		t.Fatal(err)
	}
	if stderr, code := prefetchCtl(x); code != ctl.ExitPermission {
		t.Fatalf("prefetch after reload: exit %d, %q; want %d", code, stderr, ctl.ExitPermission)
	}
	eventually(t, "a reload lets the requester dial again", 20*time.Second, func() error {
		if n := handshakes(); n <= first {
			return fmt.Errorf("%v refused handshakes, no more than before the reload", n)
		}
		return nil
	})

	// A certificate of the cluster CA that is off the holder's allow-list.
	lc, _ := tlsConfig(t, ca, "laptop", "")
	l := start(t, lc)
	if stderr, code := prefetchCtl(l); code != ctl.ExitPermission || !strings.Contains(stderr, `identity "laptop" is not allowed`) {
		t.Fatalf("prefetch off the allow-list: exit %d, %q; want %d naming the identity", code, stderr, ctl.ExitPermission)
	}
}
