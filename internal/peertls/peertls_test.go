package peertls_test

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/pegaflow/pegad/internal/metrics"
	"github.com/pegaflow/pegad/internal/metrics/metricstest"
	"github.com/pegaflow/pegad/internal/peertls"
	"github.com/pegaflow/pegad/internal/testutil"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestParseAllowList(t *testing.T) {
	a, err := peertls.ParseAllowList(" node-a , spiffe://c/*")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		names []string
		want  bool
	}{
		{[]string{"node-a"}, true},
		{[]string{"node-b", "spiffe://c/x"}, true},
		{[]string{"node-b"}, false},
		{nil, false},
	} {
		if got := a.Allows(c.names); got != c.want {
			t.Errorf("Allows(%q) = %v, want %v", c.names, got, c.want)
		}
	}
	if e, _ := peertls.ParseAllowList(""); !e.Empty() || !e.Allows(nil) {
		t.Error("empty list must allow everything")
	}
	if _, err := peertls.ParseAllowList("a,,b"); err == nil {
		t.Error("empty entry accepted")
	}
}

// files writes a node certificate for names signed by ca.
func files(t *testing.T, ca *testutil.CA, dns ...string) peertls.Files {
	t.Helper()
	f := ca.Issue(t, t.TempDir(), testutil.CertSpec{DNS: dns})
	return peertls.Files{Cert: f.Cert, Key: f.Key, CA: f.CA}
}

func TestNewRefusesBadFiles(t *testing.T) {
	ca, other := testutil.NewCA(t, "ca"), testutil.NewCA(t, "other")
	good := files(t, ca, "a")
	foreign := files(t, other, "a")
	garbage := filepath.Join(t.TempDir(), "garbage.pem")
	if err := os.WriteFile(garbage, []byte("not pem"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		f    peertls.Files
		want error
	}{
		{"missing key flag", peertls.Files{Cert: good.Cert, CA: good.CA}, peertls.ErrIncomplete},
		{"none", peertls.Files{}, peertls.ErrIncomplete},
		{"no such cert", peertls.Files{Cert: good.Cert + ".x", Key: good.Key, CA: good.CA}, peertls.ErrBadFiles},
		{"key of another cert", peertls.Files{Cert: good.Cert, Key: foreign.Key, CA: good.CA}, peertls.ErrBadFiles},
		{"CA not PEM", peertls.Files{Cert: good.Cert, Key: good.Key, CA: garbage}, peertls.ErrBadFiles},
		{"cert of another CA", peertls.Files{Cert: foreign.Cert, Key: foreign.Key, CA: good.CA}, peertls.ErrBadFiles},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := peertls.New(peertls.Options{Files: c.f, Log: zerolog.Nop()})
			if !errors.Is(err, c.want) {
				t.Fatalf("New = %v, want %v", err, c.want)
			}
		})
	}
	if _, err := peertls.New(peertls.Options{Files: good, Log: zerolog.Nop()}); err != nil {
		t.Fatalf("good files: %v", err)
	}
}

// server serves the health service behind s on loopback; seen receives the
// peertls.Peer each admitted call carried.
func server(t *testing.T, s *peertls.Source) (addr string, seen func() []peertls.Peer) {
	t.Helper()
	var mu sync.Mutex // guards peers
	var peers []peertls.Peer
	record := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		p, ok := peertls.FromContext(ctx)
		if !ok {
			t.Error("handler ran without a peertls.Peer in its context")
		}
		mu.Lock()
		peers = append(peers, p)
		mu.Unlock()
		return h(ctx, req)
	}
	srv := grpc.NewServer(grpc.Creds(s.ServerCredentials()), grpc.ChainUnaryInterceptor(s.UnaryInterceptor(), record))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(lis) }()
	t.Cleanup(func() { srv.Stop(); <-done })
	return lis.Addr().String(), func() []peertls.Peer {
		mu.Lock()
		defer mu.Unlock()
		return append([]peertls.Peer(nil), peers...)
	}
}

// check calls Health.Check over cc.
func check(t *testing.T, cc *grpc.ClientConn) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
	return err
}

func dial(t *testing.T, addr string, s *peertls.Source) *grpc.ClientConn {
	t.Helper()
	creds := insecure.NewCredentials()
	if s != nil {
		creds = s.ClientCredentials()
	}
	cc, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

func source(t *testing.T, f peertls.Files, allow string, m *metrics.Metrics, log zerolog.Logger) *peertls.Source {
	t.Helper()
	a, err := peertls.ParseAllowList(allow)
	if err != nil {
		t.Fatal(err)
	}
	o := peertls.Options{Files: f, Allow: a, Log: log}
	if m != nil {
		o.Metrics = m.PeerTLS()
	}
	s, err := peertls.New(o)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestPeerPort: a certificate of the cluster CA on the allow-list is
// served and known by its identity; a rogue CA and plaintext fail the
// handshake; a verified certificate off the list is PermissionDenied with
// one log line naming it and the remote address; each is counted.
func TestPeerPort(t *testing.T) {
	ca, rogue := testutil.NewCA(t, "cluster"), testutil.NewCA(t, "rogue")
	m := metricstest.New()
	logs := &testutil.LogBuffer{}
	srv := source(t, files(t, ca, "holder"), "node-*", m, zerolog.New(logs))
	addr, seen := server(t, srv)

	good := source(t, files(t, ca, "node-a"), "", nil, zerolog.Nop())
	if err := check(t, dial(t, addr, good)); err != nil {
		t.Fatalf("allowed peer: %v", err)
	}
	if p := seen(); len(p) != 1 || p[0].Identity != "node-a" {
		t.Fatalf("handler saw %+v, want identity node-a", p)
	}

	bad := source(t, files(t, rogue, "node-a"), "", nil, zerolog.Nop())
	if err := check(t, dial(t, addr, bad)); status.Code(err) != codes.Unavailable {
		t.Errorf("rogue CA: %v, want Unavailable (handshake refused)", err)
	}
	if err := check(t, dial(t, addr, nil)); status.Code(err) != codes.Unavailable {
		t.Errorf("plaintext: %v, want Unavailable", err)
	}
	// The server counts after the client saw the failure: wait for it.
	deadline := time.Now().Add(20 * time.Second)
	for metrics.Value(m.PeerAuthRefused.WithLabelValues(metrics.AuthTLSHandshake)) < 2 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if v := metrics.Value(m.PeerAuthRefused.WithLabelValues(metrics.AuthTLSHandshake)); v < 2 {
		t.Errorf("handshake refusals counted %v, want >= 2", v)
	}

	off := source(t, files(t, ca, "intruder"), "", nil, zerolog.Nop())
	err := check(t, dial(t, addr, off))
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "intruder") {
		t.Errorf("off the allow-list: %v, want PermissionDenied naming the identity", err)
	}
	if v := metrics.Value(m.PeerAuthRefused.WithLabelValues(metrics.AuthNotAllowed)); v != 1 {
		t.Errorf("not_allowed refusals = %v, want 1", v)
	}
	var line string
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, "not on --peer-allow") {
			if line != "" {
				t.Errorf("more than one log line for one refusal:\n%s", logs)
			}
			line = l
		}
	}
	if !strings.Contains(line, `"peer":"intruder"`) || !strings.Contains(line, `"remote":"127.0.0.1:`) {
		t.Errorf("refusal log line lacks identity or remote: %q", line)
	}
	if len(seen()) != 1 {
		t.Errorf("a refused call reached the handler: %+v", seen())
	}
}

// TestClientVerifiesHolder: the requester refuses a holder whose
// certificate another CA signed.
func TestClientVerifiesHolder(t *testing.T) {
	ca, rogue := testutil.NewCA(t, "cluster"), testutil.NewCA(t, "rogue")
	// The rogue holder trusts the cluster CA for clients but presents a
	// rogue certificate: only the client's check can refuse it.
	rf := files(t, rogue, "holder")
	rf.CA = ca.WriteCA(t, t.TempDir())
	rs, err := peertls.NewUnchecked(rf)
	if err != nil {
		t.Fatal(err)
	}
	addr, seen := server(t, rs)
	client := source(t, files(t, ca, "node-a"), "", nil, zerolog.Nop())
	if err := check(t, dial(t, addr, client)); status.Code(err) != codes.Unavailable {
		t.Fatalf("holder of a rogue CA: %v, want Unavailable", err)
	}
	if len(seen()) != 0 {
		t.Fatal("call reached the rogue holder")
	}
}

// TestReload: a rotated certificate is used by new handshakes while the
// connection made before keeps working; a bad file keeps the old material
// and says why.
func TestReload(t *testing.T) {
	ca := testutil.NewCA(t, "cluster")
	dir := t.TempDir()
	f0 := ca.Issue(t, dir, testutil.CertSpec{DNS: []string{"holder-v1"}})
	f := peertls.Files{Cert: f0.Cert, Key: f0.Key, CA: f0.CA}
	m := metricstest.New()
	logs := &testutil.LogBuffer{}
	srv := source(t, f, "", m, zerolog.New(logs))
	addr, _ := server(t, srv)
	client := source(t, files(t, ca, "node-a"), "", nil, zerolog.Nop())
	old := dial(t, addr, client)
	if err := check(t, old); err != nil {
		t.Fatal(err)
	}

	// A truncated certificate: the reload fails and v1 stays.
	if err := os.WriteFile(f.Cert, []byte("-----BEGIN CERTIFICATE-----\nAAAA"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := srv.Reload(); !errors.Is(err, peertls.ErrBadFiles) {
		t.Fatalf("reload of a bad file: %v, want peertls.ErrBadFiles", err)
	}
	if srv.Identity() != "holder-v1" || !strings.Contains(logs.String(), "keeping the certificate and CA in use") {
		t.Fatalf("after a bad reload: identity %q; logs:\n%s", srv.Identity(), logs)
	}
	if err := check(t, dial(t, addr, client)); err != nil {
		t.Fatalf("new connection after a bad reload: %v", err)
	}

	ca.Issue(t, dir, testutil.CertSpec{DNS: []string{"holder-v2"}, Validity: 48 * time.Hour})
	if err := srv.Reload(); err != nil {
		t.Fatal(err)
	}
	if srv.Identity() != "holder-v2" {
		t.Fatalf("identity after reload %q", srv.Identity())
	}
	if got, want := metrics.Value(m.PeerCertExpiry), float64(srv.NotAfter().Unix()); got != want {
		t.Errorf("expiry metric %v, want %v", got, want)
	}
	if metrics.Value(m.PeerTLSReloads.WithLabelValues("ok")) != 1 || metrics.Value(m.PeerTLSReloads.WithLabelValues("error")) != 1 {
		t.Error("reloads not counted by result")
	}
	// A fresh connection sees v2; the old one still works.
	var got string
	vc := client.ClientConfig()
	verify := vc.VerifyConnection
	vc.VerifyConnection = func(cs tlsState) error {
		got = peertls.Identity(cs.PeerCertificates[0])
		return verify(cs)
	}
	cc, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(credentialsNewTLS(vc)))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	if err := check(t, cc); err != nil || got != "holder-v2" {
		t.Fatalf("fresh connection: err %v, holder %q, want holder-v2", err, got)
	}
	if err := check(t, old); err != nil {
		t.Fatalf("connection made before the rotation: %v", err)
	}
}

func TestWarnExpiry(t *testing.T) {
	ca := testutil.NewCA(t, "cluster")
	for _, c := range []struct {
		validity time.Duration
		warn     bool
	}{
		{3 * 24 * time.Hour, true},
		{30 * 24 * time.Hour, false},
	} {
		f := ca.Issue(t, t.TempDir(), testutil.CertSpec{DNS: []string{"n"}, Validity: c.validity})
		logs := &testutil.LogBuffer{}
		s := source(t, peertls.Files{Cert: f.Cert, Key: f.Key, CA: f.CA}, "", nil, zerolog.New(logs))
		if got := s.WarnExpiry(); got != c.warn || strings.Contains(logs.String(), "expires soon") != c.warn {
			t.Errorf("validity %s: warned %v, want %v; logs %s", c.validity, got, c.warn, logs)
		}
	}
}

type tlsState = tls.ConnectionState

var credentialsNewTLS = credentials.NewTLS

// TestReasonsAreMetricLabels: the reasons peertls counts are the reason
// label values the metrics pre-create, so a refusal adds to a series that
// dashboards already see.
func TestReasonsAreMetricLabels(t *testing.T) {
	for _, tc := range []struct{ peertls, metric string }{
		{peertls.ReasonTLSHandshake, metrics.AuthTLSHandshake},
		{peertls.ReasonNotAllowed, metrics.AuthNotAllowed},
	} {
		if tc.peertls != tc.metric {
			t.Errorf("peertls reason %q, metrics label %q", tc.peertls, tc.metric)
		}
	}
}
