package integration

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/internal/config"
	"github.com/pegaflow/pegad/internal/peertls"
	"github.com/pegaflow/pegad/internal/testutil"
)

// tlsConfig is baseConfig with mTLS files for a node certificate naming
// nodeID, issued by ca into a fresh directory.
func tlsConfig(t *testing.T, ca *testutil.CA, nodeID, allow string) (config.Config, testutil.NodeFiles) {
	t.Helper()
	c := baseConfig(t, nodeID)
	f := ca.Issue(t, filepath.Join(t.TempDir(), nodeID), testutil.CertSpec{DNS: []string{nodeID}})
	c.PeerTLSCert, c.PeerTLSKey, c.PeerTLSCA, c.PeerAllow = f.Cert, f.Key, f.CA, allow
	return c, f
}

// peerClient dials addr's peer port with the certificate of files (plain
// text when files is nil).
func peerClient(t *testing.T, addr string, files *testutil.NodeFiles) pegadv1.PeerServiceClient {
	t.Helper()
	creds := insecure.NewCredentials()
	if files != nil {
		s, err := peertls.New(peertls.Options{Files: peertls.Files{Cert: files.Cert, Key: files.Key, CA: files.CA}, Log: zerolog.Nop()})
		if err != nil {
			t.Fatal(err)
		}
		creds = s.ClientCredentials()
	}
	cc, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return pegadv1.NewPeerServiceClient(cc)
}

func query(ctx context.Context, c pegadv1.PeerServiceClient, node, ns string, hashes ...[]byte) (*pegadv1.QueryBlocksForTransferResponse, error) {
	return c.QueryBlocksForTransfer(ctx, &pegadv1.QueryBlocksForTransferRequest{
		Namespace: ns, Hashes: hashes, Requester: &pegadv1.Requester{NodeId: node, Incarnation: "i1"}})
}

// fetchAll prefetches blocks from holder to r and checks every byte.
func fetchAll(t *testing.T, r, holder *node, ns string, blocks []block) {
	t.Helper()
	ctx := ctxT(t, 60*time.Second)
	for _, b := range blocks {
		resp, err := prefetch(ctx, r, holder.d.PeerAddr(), ns, b.hash)
		if err != nil {
			t.Fatalf("prefetch %s: %v", b.hash, err)
		}
		if st := resp.GetBlocks()[0]; st.GetStatus() != statusFetched {
			t.Fatalf("prefetch %s: %v %s", b.hash, st.GetStatus(), st.GetError())
		}
		got, err := get(ctx, r, ns, b.hash)
		if err != nil || !bytes.Equal(got, b.body) {
			t.Fatalf("block %s after fetch: err %v, %d bytes, equal %v", b.hash, err, len(got), bytes.Equal(got, b.body))
		}
	}
}

// TestMTLSPeers: two nodes fetch over mTLS; a rogue-CA certificate, a
// valid certificate off the allow-list, a plaintext client and a peer
// claiming another's node id are refused, and each refusal is counted.
func TestMTLSPeers(t *testing.T) {
	const ns = "mtls"
	ca, rogue := testutil.NewCA(t, "cluster"), testutil.NewCA(t, "rogue")
	hc, _ := tlsConfig(t, ca, "node-h", "node-*")
	h := start(t, hc)
	rc, rf := tlsConfig(t, ca, "node-r", "node-*")
	r := start(t, rc)
	blocks := randomBlocks(rand.New(rand.NewPCG(10, 1)), "b", 6, 1, 200<<10)
	putAll(t, h, ns, blocks)
	fetchAll(t, r, h, ns, blocks)

	ctx := ctxT(t, 30*time.Second)
	rogueFiles := rogue.Issue(t, t.TempDir(), testutil.CertSpec{DNS: []string{"node-x"}})
	offList := ca.Issue(t, t.TempDir(), testutil.CertSpec{DNS: []string{"laptop"}})
	for _, c := range []struct {
		name  string
		files *testutil.NodeFiles
		node  string
		code  codes.Code
	}{
		{"rogue CA", &rogueFiles, "node-x", codes.Unavailable},
		{"plaintext", nil, "node-x", codes.Unavailable},
		{"off the allow-list", &offList, "laptop", codes.PermissionDenied},
		{"claims another node", &rf, "node-h", codes.PermissionDenied},
	} {
		_, err := query(ctx, peerClient(t, h.d.PeerAddr(), c.files), c.node, ns, blocks[0].hash)
		if status.Code(err) != c.code {
			t.Errorf("%s: %v, want %v", c.name, err, c.code)
		}
	}
	// The holder counts a failed handshake after the client saw it fail.
	eventually(t, "refusals counted by reason", 20*time.Second, func() error {
		m := h.cn.Scrape(t)
		for reason, min := range map[string]float64{"tls_handshake": 2, "not_allowed": 1, "identity_mismatch": 1} {
			if got := m[fmt.Sprintf(`pegaflow_peer_auth_refused_total{reason=%q}`, reason)]; got < min {
				return fmt.Errorf("refusals for %s = %v, want >= %v", reason, got, min)
			}
		}
		return nil
	})
	m := h.cn.Scrape(t)
	if m[`pegaflow_peer_tls_cert_expiry_timestamp_seconds`] < float64(time.Now().Unix()) {
		t.Errorf("cert expiry metric %v", m[`pegaflow_peer_tls_cert_expiry_timestamp_seconds`])
	}
	if !strings.Contains(h.logs.String(), `"peer":"laptop"`) {
		t.Errorf("no log line names the refused identity:\n%s", h.logs)
	}
	// A requester whose CA the holder does not trust cannot fetch.
	xc := baseConfig(t, "node-x")
	xf := rogue.Issue(t, t.TempDir(), testutil.CertSpec{DNS: []string{"node-x"}})
	xc.PeerTLSCert, xc.PeerTLSKey, xc.PeerTLSCA = xf.Cert, xf.Key, xf.CA
	x := start(t, xc)
	resp, err := prefetch(ctx, x, h.d.PeerAddr(), ns, blocks[0].hash)
	if err == nil && resp.GetBlocks()[0].GetStatus() == statusFetched {
		t.Fatal("a node of a rogue CA fetched a block")
	}
}

// TestPeerFloodCapped: one identity opens sessions without releasing them
// and is refused past its cap with RESOURCE_EXHAUSTED naming the limit,
// while another peer keeps fetching.
func TestPeerFloodCapped(t *testing.T) {
	const ns = "flood"
	const capSessions = 8
	ca := testutil.NewCA(t, "cluster")
	hc, _ := tlsConfig(t, ca, "node-h", "")
	hc.MaxSessionsPerPeer = capSessions
	h := start(t, hc)
	rc, _ := tlsConfig(t, ca, "node-r", "")
	r := start(t, rc)
	blocks := randomBlocks(rand.New(rand.NewPCG(11, 1)), "b", 4, 1, 64<<10)
	putAll(t, h, ns, blocks)

	flood := ca.Issue(t, t.TempDir(), testutil.CertSpec{DNS: []string{"flooder"}})
	fc := peerClient(t, h.d.PeerAddr(), &flood)
	ctx := ctxT(t, 60*time.Second)
	granted := 0
	for i := 0; i < 10*capSessions; i++ {
		_, err := query(ctx, fc, "flooder", ns, blocks[0].hash)
		if err == nil {
			granted++
			continue
		}
		if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "max-sessions-per-peer") {
			t.Fatalf("query %d: %v, want ResourceExhausted naming max-sessions-per-peer", i, err)
		}
	}
	if granted != capSessions {
		t.Fatalf("flooder got %d sessions, want %d", granted, capSessions)
	}
	// The flooder cannot spend another peer's share by claiming its name.
	if _, err := query(ctx, fc, "node-r", ns, blocks[0].hash); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("flooder claiming node-r: %v, want PermissionDenied", err)
	}
	fetchAll(t, r, h, ns, blocks)
	m := h.cn.Scrape(t)
	if got := m[`pegaflow_peer_limit_refused_total{limit="max-sessions-per-peer"}`]; got != 10*capSessions-capSessions {
		t.Errorf("limit refusals = %v, want %d", got, 10*capSessions-capSessions)
	}
	if got := m[`pegaflow_peer_limit{limit="max-pinned-bytes"}`]; got != float64(hc.EffectiveMaxPinnedBytes()) {
		t.Errorf("node pin cap metric %v, want %d", got, hc.EffectiveMaxPinnedBytes())
	}
}

// TestCertRotatedBySIGHUP: the holder's certificate is replaced on disk
// and SIGHUP makes new handshakes present it, without a restart; the
// requester's established connection and its fetches carry on, and a bad
// file at the next SIGHUP keeps the new certificate.
func TestCertRotatedBySIGHUP(t *testing.T) {
	const ns = "rotate"
	ca := testutil.NewCA(t, "cluster")
	hc, hf := tlsConfig(t, ca, "node-h", "")
	h := start(t, hc)
	rc, rf := tlsConfig(t, ca, "node-r", "")
	r := start(t, rc)
	blocks := randomBlocks(rand.New(rand.NewPCG(12, 1)), "b", 6, 1, 64<<10)
	putAll(t, h, ns, blocks)
	fetchAll(t, r, h, ns, blocks[:3])
	before := serving(t, h.d.PeerAddr(), rf)
	incarnation := h.d.Incarnation()
	const handshakes = `pegaflow_rdma_handshakes_total{result="ok",role="holder"}`
	hs := h.cn.Scrape(t)[handshakes]

	// Issue the replacement into the same paths, as a renewal job would.
	ca.Issue(t, filepath.Dir(hf.Cert), testutil.CertSpec{DNS: []string{"node-h"}, Validity: 72 * time.Hour})
	reloads := func() float64 { return h.cn.Scrape(t)[`pegaflow_peer_tls_reloads_total{result="ok"}`] }
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the reload", 30*time.Second, func() error {
		if reloads() < 1 {
			return fmt.Errorf("no reload yet")
		}
		return nil
	})
	after := serving(t, h.d.PeerAddr(), rf)
	if after.SerialNumber.Cmp(before.SerialNumber) == 0 || !after.NotAfter.After(before.NotAfter) {
		t.Fatalf("after SIGHUP the holder still serves serial %v (before %v)", after.SerialNumber, before.SerialNumber)
	}
	if h.d.Incarnation() != incarnation {
		t.Fatal("the holder restarted")
	}
	fetchAll(t, r, h, ns, blocks[3:])
	if got := h.cn.Scrape(t)[handshakes]; got != hs || hs == 0 {
		t.Errorf("holder handshakes %v after the rotation, %v before: the QPs were not kept", got, hs)
	}

	// A broken file: the reload fails and the rotated certificate stays.
	if err := os.WriteFile(hf.Key, []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := h.d.ReloadTLS(); err == nil {
		t.Fatal("reload of a broken key succeeded")
	}
	if got := serving(t, h.d.PeerAddr(), rf); got.SerialNumber.Cmp(after.SerialNumber) != 0 {
		t.Fatalf("after a failed reload the holder serves serial %v, want %v", got.SerialNumber, after.SerialNumber)
	}
}

// serving handshakes with addr as the node of files and returns the
// certificate the holder presented.
func serving(t *testing.T, addr string, files testutil.NodeFiles) *x509.Certificate {
	t.Helper()
	cert, err := tls.LoadX509KeyPair(files.Cert, files.Key)
	if err != nil {
		t.Fatal(err)
	}
	pem, err := os.ReadFile(files.CA)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pem)
	conn, err := tls.Dial("tcp", addr, &tls.Config{
		Certificates: []tls.Certificate{cert}, RootCAs: roots, ServerName: "node-h", NextProtos: []string{"h2"},
	})
	if err != nil {
		t.Fatalf("handshake with %s: %v", addr, err)
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0]
}
