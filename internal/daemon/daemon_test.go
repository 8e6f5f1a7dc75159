package daemon_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"go.uber.org/goleak"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/internal/config"
	"github.com/pegaflow/pegad/internal/daemon"
	"github.com/pegaflow/pegad/internal/requester"
	"github.com/pegaflow/pegad/internal/testutil"
	"github.com/pegaflow/pegad/internal/testutil/cluster"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// testConfig is a loopback, tcp-transport config with ephemeral ports and a
// socket in a temp dir.
func testConfig(t testing.TB) config.Config {
	t.Helper()
	c := testutil.LoopbackConfig("test-"+t.Name(), filepath.Join(t.TempDir(), "pegad.sock"))
	c.LockTimeout = 2 * time.Second
	return c
}

type node struct {
	d     *daemon.Daemon
	logs  *testutil.LogBuffer
	local pegadv1.LocalServiceClient
	admin pegadv1.AdminServiceClient
	peer  pegadv1.PeerServiceClient
	lh    healthpb.HealthClient
	ph    healthpb.HealthClient
	notes *[]string
}

// startNode starts a daemon in process (cluster.Start) with cfg as its
// whole config, debug logs and its sd_notify states recorded, and clients
// of its socket and peer port. It is closed at cleanup unless the test
// closed it.
func startNode(t *testing.T, cfg config.Config, opts ...daemon.Option) *node {
	t.Helper()
	var mu sync.Mutex
	notes := &[]string{}
	cn := cluster.Start(t, cluster.Named(cfg.NodeID), cluster.WithConfig(func(c *config.Config) { *c = cfg }), cluster.DebugLogs(),
		cluster.WithDaemonOptions(append([]daemon.Option{
			daemon.WithNotify(func(s string) { mu.Lock(); *notes = append(*notes, s); mu.Unlock() })}, opts...)...))
	n := &node{d: cn.Daemon(), logs: cn.Logs, notes: notes,
		local: cn.Local, admin: cn.Admin, peer: cn.Peer, lh: healthpb.NewHealthClient(cn.LocalConn)}
	if cn.PeerConn != nil {
		n.ph = healthpb.NewHealthClient(cn.PeerConn)
	}
	return n
}

func ctxT(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func putBlock(t *testing.T, n *node, ns string, hash []byte, body []byte, kv bool) {
	t.Helper()
	resp, err := testutil.PutBlock(ctxT(t), n.local, ns, hash, body, kv)
	if err != nil || resp.GetBytes() != uint64(len(body)) || !resp.GetCreated() {
		t.Fatalf("put %x: %v, %v", hash, resp, err)
	}
}

func getBlock(t *testing.T, n *node, ns string, hash []byte) []byte {
	t.Helper()
	b, err := testutil.GetBlock(ctxT(t), n.local, ns, hash)
	if err != nil {
		t.Fatalf("get %x: %v", hash, err)
	}
	return b
}

func metric(t *testing.T, addr, name string) float64 {
	t.Helper()
	m := cluster.Scrape(t, addr)
	v, ok := m[name]
	if !ok {
		t.Fatalf("metric %s not exported", name)
	}
	return v
}

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed ^ byte(i) ^ byte(i>>9)
	}
	return b
}

func eventually(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestHolderNode is issue 2's end-to-end check in process: put blocks over
// the socket, lock them through the peer port, list and force-release a
// session, let another expire, and watch metrics and pool memory.
func TestHolderNode(t *testing.T) {
	cfg := testConfig(t)
	n := startNode(t, cfg)
	ctx := ctxT(t)
	m := n.d.MetricsAddr()

	// Health on both servers, READY sent, /healthz answers.
	for _, c := range []struct {
		h   healthpb.HealthClient
		svc string
	}{{n.lh, ""}, {n.lh, "pegad.v1.LocalService"}, {n.lh, "pegad.v1.AdminService"}, {n.ph, ""}, {n.ph, "pegad.v1.PeerService"}} {
		r, err := c.h.Check(ctx, &healthpb.HealthCheckRequest{Service: c.svc})
		if err != nil || r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("health %q: %v, %v", c.svc, r, err)
		}
	}
	if len(*n.notes) == 0 || (*n.notes)[0] != "READY=1" {
		t.Fatalf("sd_notify: %v, want READY=1 first", *n.notes)
	}
	if resp, err := http.Get("http://" + m + "/healthz"); err != nil || resp.StatusCode != 200 {
		t.Fatalf("/healthz: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	if !strings.Contains(n.logs.String(), `"transport":"tcp"`) || !strings.Contains(n.logs.String(), `"reason":"requested"`) {
		t.Fatalf("no transport line in logs:\n%s", n.logs)
	}
	if fi, err := os.Stat(cfg.Socket); err != nil || fi.Mode().Perm() != daemon.SocketMode {
		t.Fatalf("socket mode: %v %v", fi, err)
	}
	baseUsed := metric(t, m, "pegaflow_pool_used_bytes")

	const ns = "it"
	blocks := map[string][]byte{
		"\x01": pattern(3<<20+17, 1), // multi-chunk
		"\x02": pattern(4096, 2),
		"\x03": pattern(1<<20, 3),
	}
	for h, b := range blocks {
		putBlock(t, n, ns, []byte(h), b, h == "\x03")
	}
	for h, b := range blocks {
		if got := getBlock(t, n, ns, []byte(h)); !bytes.Equal(got, b) {
			t.Fatalf("block %x read back differs (%d vs %d bytes)", h, len(got), len(b))
		}
	}
	usedWithBlocks := metric(t, m, "pegaflow_pool_used_bytes")
	if usedWithBlocks <= baseUsed {
		t.Fatalf("pool used %v after puts, baseline %v", usedWithBlocks, baseUsed)
	}

	// Lock two sessions through the peer port.
	req := &pegadv1.Requester{NodeId: "req-node", Incarnation: "inc-1"}
	q1, err := n.peer.QueryBlocksForTransfer(ctx, &pegadv1.QueryBlocksForTransferRequest{
		Namespace: ns, Hashes: [][]byte{{1}, {2}}, Requester: req})
	if err != nil || q1.GetSessionId() == "" || len(q1.GetBlocks()) != 2 {
		t.Fatalf("query 1: %v, %v", q1, err)
	}
	q2, err := n.peer.QueryBlocksForTransfer(ctx, &pegadv1.QueryBlocksForTransferRequest{
		Namespace: ns, Hashes: [][]byte{{3}, {9}}, Requester: req})
	if err != nil || len(q2.GetBlocks()) != 1 || len(q2.GetMissing()) != 1 {
		t.Fatalf("query 2: %v, %v", q2, err)
	}
	if q1.GetLockTimeout().AsDuration() != cfg.LockTimeout {
		t.Fatalf("lock timeout %v, want %v", q1.GetLockTimeout().AsDuration(), cfg.LockTimeout)
	}

	ls, err := n.admin.ListSessions(ctx, &pegadv1.ListSessionsRequest{})
	if err != nil || len(ls.GetSessions()) != 2 {
		t.Fatalf("sessions: %v, %v", ls, err)
	}
	for _, s := range ls.GetSessions() {
		if s.GetRequesterId() != "req-node" || s.GetExpiresIn().AsDuration() <= 0 || s.GetExpiresIn().AsDuration() > cfg.LockTimeout {
			t.Fatalf("session row %v", s)
		}
	}
	if v := metric(t, m, "pegaflow_transfer_sessions_active"); v != 2 {
		t.Fatalf("sessions_active %v, want 2", v)
	}
	if v := metric(t, m, "pegaflow_transfer_lock_active"); v != 3 {
		t.Fatalf("lock_active %v, want 3", v)
	}

	// Force-release the first; the second stays.
	rl, err := n.admin.ReleaseLock(ctx, &pegadv1.ReleaseLockRequest{SessionId: q1.GetSessionId(), Operator: "tester@host"})
	if err != nil || rl.GetReleasedBlocks() != 2 {
		t.Fatalf("release: %v, %v", rl, err)
	}
	if _, err := n.admin.ReleaseLock(ctx, &pegadv1.ReleaseLockRequest{SessionId: q1.GetSessionId()}); status.Code(err) != codes.NotFound {
		t.Fatalf("second force release: %v, want NotFound", err)
	}
	if want := fmt.Sprintf(`"operator":"tester@host (uid=%d gid=%d pid=%d)"`, os.Getuid(), os.Getgid(), os.Getpid()); !strings.Contains(n.logs.String(), want) {
		t.Fatalf("force release not logged with the operator and its peer credentials %s:\n%s", want, n.logs)
	}
	// The requester's own late release learns the session is gone.
	rel, err := n.peer.ReleaseTransferLock(ctx, &pegadv1.ReleaseTransferLockRequest{SessionId: q1.GetSessionId(), Requester: req})
	if err != nil || rel.GetWasLive() || rel.GetEnd() != pegadv1.SessionEnd_SESSION_END_FORCE_RELEASED {
		t.Fatalf("late release: %v, %v", rel, err)
	}

	// Delete the block the second session pins: memory stays until expiry.
	del, err := n.local.DeleteBlock(ctx, &pegadv1.DeleteBlockRequest{Namespace: ns, Hash: []byte{3}})
	if err != nil || !del.GetDeferred() {
		t.Fatalf("delete pinned: %v, %v", del, err)
	}
	if v := metric(t, m, "pegaflow_pool_used_bytes"); v != usedWithBlocks {
		t.Fatalf("pool used %v after deleting a pinned block, want unchanged %v", v, usedWithBlocks)
	}

	// Let the second session expire.
	// A lapsed session leaves the listings at its deadline; the sweeper
	// then ends it, counts the timeout and frees what it pinned.
	eventually(t, "session expiry", 3*cfg.LockTimeout, func() bool {
		ls, err := n.admin.ListSessions(ctx, &pegadv1.ListSessionsRequest{})
		return err == nil && len(ls.GetSessions()) == 0 && metric(t, m, "pegaflow_transfer_sessions_active") == 0 &&
			metric(t, m, "pegaflow_transfer_lock_timeouts_total") >= 1
	})
	samples := cluster.Scrape(t, m)
	if v := samples["pegaflow_transfer_lock_timeouts_total"]; v != 1 {
		t.Fatalf("lock_timeouts_total %v, want 1", v)
	}
	if v := samples["pegaflow_transfer_sessions_active"]; v != 0 {
		t.Fatalf("sessions_active %v after expiry", v)
	}
	if v := samples[`pegaflow_holder_rpc_total{code="OK",rpc="query_blocks_for_transfer"}`]; v != 2 {
		t.Fatalf("holder rpc counter %v, want 2", v)
	}
	wantUsed := usedWithBlocks - float64(len(blocks["\x03"]))
	if v := samples["pegaflow_pool_used_bytes"]; v > wantUsed || v < baseUsed {
		t.Fatalf("pool used %v after expiry, want <= %v (the deleted block's memory back)", v, wantUsed)
	}
	if _, ok := samples["go_goroutines"]; !ok {
		t.Fatal("Go runtime metrics missing")
	}
	if _, ok := samples[`grpc_server_handled_total{grpc_code="OK",grpc_method="QueryBlocksForTransfer",grpc_service="pegad.v1.PeerService",grpc_type="unary"}`]; !ok {
		t.Fatal("gRPC server metrics missing")
	}
	if !strings.Contains(n.logs.String(), "Transfer lock expired") {
		t.Fatal("expiry not logged")
	}
	rel, err = n.peer.ReleaseTransferLock(ctx, &pegadv1.ReleaseTransferLockRequest{SessionId: q2.GetSessionId(), Requester: req})
	if err != nil || rel.GetWasLive() || rel.GetEnd() != pegadv1.SessionEnd_SESSION_END_EXPIRED {
		t.Fatalf("release after expiry: %v, %v", rel, err)
	}

	// Delete the rest: pool back to baseline.
	for _, h := range []byte{1, 2} {
		if _, err := n.local.DeleteBlock(ctx, &pegadv1.DeleteBlockRequest{Namespace: ns, Hash: []byte{h}}); err != nil {
			t.Fatal(err)
		}
	}
	if v := metric(t, m, "pegaflow_pool_used_bytes"); v != baseUsed {
		t.Fatalf("pool used %v after deleting everything, want baseline %v", v, baseUsed)
	}

	// Shutdown: clean, idempotent, socket removed, STOPPING sent.
	if err := n.d.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	if err := n.d.Close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
	if _, err := os.Stat(cfg.Socket); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("socket left after close: %v", err)
	}
	if last := (*n.notes)[len(*n.notes)-1]; last != "STOPPING=1" {
		t.Fatalf("last sd_notify %q, want STOPPING=1", last)
	}
}

// TestShutdownReleasesSessions: live holder sessions end at shutdown.
func TestShutdownReleasesSessions(t *testing.T) {
	cfg := testConfig(t)
	cfg.LockTimeout = time.Minute
	cfg.ShutdownTimeout = 300 * time.Millisecond // the drain waits for a release that never comes
	n := startNode(t, cfg)
	putBlock(t, n, "ns", []byte{7}, pattern(1000, 7), false)
	q, err := n.peer.QueryBlocksForTransfer(ctxT(t), &pegadv1.QueryBlocksForTransferRequest{
		Namespace: "ns", Hashes: [][]byte{{7}}, Requester: &pegadv1.Requester{NodeId: "r", Incarnation: "i"}})
	if err != nil || q.GetSessionId() == "" {
		t.Fatalf("query: %v %v", q, err)
	}
	if err := n.d.Close(); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(n.logs.String(), "Released all transfer locks") {
		t.Fatalf("sessions not released at shutdown:\n%s", n.logs)
	}
}

// TestIncarnationPerStart (issue 5 bullet 5): two starts of one config are
// two incarnations, and the one a holder records on the requester's
// transfer lock is the running start's. Without that, a holder cannot tell
// a restarted requester from the old one and keeps the old locks until they
// time out.
func TestIncarnationPerStart(t *testing.T) {
	hcfg := testConfig(t)
	hcfg.NodeID = "holder"
	hcfg.LockTimeout = time.Minute
	h := startNode(t, hcfg)
	putBlock(t, h, "ns", []byte{9}, pattern(4096, 9), false)

	rcfg := testConfig(t)
	rcfg.NodeID = "requester"
	var incs []string
	for start := range 2 {
		atRelease := make(chan struct{})
		unblock := make(chan struct{})
		r := startNode(t, rcfg, daemon.WithRequesterFaults(func(ctx context.Context, _, phase string) {
			if phase != requester.PhaseRelease {
				return
			}
			close(atRelease)
			select { // hold the lock while the holder's sessions are listed
			case <-unblock:
			case <-ctx.Done():
			}
		}))
		inc := r.d.Incarnation()
		if inc == "" {
			t.Fatalf("start %d: empty incarnation", start)
		}
		if !strings.Contains(r.logs.String(), inc) {
			t.Errorf("start %d: incarnation %q not in the start-up log", start, inc)
		}
		done := make(chan error, 1)
		go func() {
			_, err := r.local.Prefetch(ctxT(t), &pegadv1.PrefetchRequest{Peer: h.d.PeerAddr(), Namespace: "ns", Hashes: [][]byte{{9}}})
			done <- err
		}()
		select {
		case <-atRelease:
		case err := <-done:
			t.Fatalf("start %d: prefetch ended before its release: %v", start, err)
		case <-time.After(15 * time.Second):
			t.Fatalf("start %d: prefetch did not reach its release", start)
		}
		ls, err := h.admin.ListSessions(ctxT(t), &pegadv1.ListSessionsRequest{})
		close(unblock)
		if perr := <-done; perr != nil {
			t.Errorf("start %d: prefetch: %v", start, perr)
		}
		if err != nil || len(ls.GetSessions()) != 1 {
			t.Fatalf("start %d: holder sessions %v %v, want 1", start, ls, err)
		}
		if s := ls.GetSessions()[0]; s.GetRequesterId() != "requester" || s.GetRequesterIncarnation() != inc {
			t.Fatalf("start %d: holder records the lock as %q/%q, want requester/%q",
				start, s.GetRequesterId(), s.GetRequesterIncarnation(), inc)
		}
		if err := r.d.Close(); err != nil {
			t.Fatal(err)
		}
		incs = append(incs, inc)
	}
	if incs[0] == incs[1] {
		t.Fatalf("two starts of one config share incarnation %q", incs[0])
	}
}

func TestStartErrors(t *testing.T) {
	t.Run("socket in use", func(t *testing.T) {
		cfg := testConfig(t)
		startNode(t, cfg)
		cfg2 := cfg
		_, err := daemon.Start(context.Background(), cfg2, daemon.WithLogger(zerolog.Nop()), daemon.WithNotify(func(string) {}))
		if !errors.Is(err, daemon.ErrSocketInUse) {
			t.Fatalf("second daemon on the same socket: %v, want ErrSocketInUse", err)
		}
	})
	t.Run("stale socket removed", func(t *testing.T) {
		cfg := testConfig(t)
		l, err := net.Listen("unix", cfg.Socket)
		if err != nil {
			t.Fatal(err)
		}
		// Close without unlinking: a stale socket file is left behind.
		l.(*net.UnixListener).SetUnlinkOnClose(false)
		l.Close()
		n := startNode(t, cfg)
		if _, err := n.admin.Version(ctxT(t), &pegadv1.VersionRequest{}); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("non-socket file kept", func(t *testing.T) {
		cfg := testConfig(t)
		if err := os.WriteFile(cfg.Socket, []byte("keep"), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := daemon.Start(context.Background(), cfg, daemon.WithLogger(zerolog.Nop()), daemon.WithNotify(func(string) {})); err == nil ||
			!strings.Contains(err.Error(), "not a socket") {
			t.Fatalf("got %v, want a not-a-socket error", err)
		}
		if b, _ := os.ReadFile(cfg.Socket); string(b) != "keep" {
			t.Fatal("a regular file at the socket path was touched")
		}
	})
	t.Run("peer port in use", func(t *testing.T) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		cfg := testConfig(t)
		cfg.Listen = l.Addr().String()
		if _, err := daemon.Start(context.Background(), cfg, daemon.WithLogger(zerolog.Nop()), daemon.WithNotify(func(string) {})); err == nil ||
			!strings.Contains(err.Error(), cfg.Listen) {
			t.Fatalf("got %v, want an error naming %s", err, cfg.Listen)
		}
		if _, err := os.Stat(cfg.Socket); !errors.Is(err, os.ErrNotExist) {
			t.Fatal("failed start left its socket behind")
		}
	})
	t.Run("invalid config", func(t *testing.T) {
		cfg := testConfig(t)
		cfg.QPsPerPeer = 0
		if _, err := daemon.Start(context.Background(), cfg, daemon.WithLogger(zerolog.Nop())); err == nil || !strings.Contains(err.Error(), "qps-per-peer") {
			t.Fatalf("got %v", err)
		}
	})
}

func TestTransportSelection(t *testing.T) {
	daemon.SetVerbsProbe(t, func() (bool, string) { return false, "verbs unavailable: no RDMA devices (test)" })

	t.Run("verbs requested but unavailable", func(t *testing.T) {
		cfg := testConfig(t)
		cfg.Transport = config.TransportVerbs
		_, err := daemon.Start(context.Background(), cfg, daemon.WithLogger(zerolog.Nop()), daemon.WithNotify(func(string) {}))
		if !errors.Is(err, daemon.ErrVerbsUnavailable) || !strings.Contains(err.Error(), "no RDMA devices (test)") {
			t.Fatalf("got %v, want ErrVerbsUnavailable with the reason", err)
		}
	})
	t.Run("auto falls back to tcp and says why", func(t *testing.T) {
		cfg := testConfig(t)
		cfg.Transport = config.TransportAuto
		cfg.NICs = "2"
		n := startNode(t, cfg)
		if n.d.Transport() != "tcp" {
			t.Fatalf("transport %s", n.d.Transport())
		}
		logs := n.logs.String()
		if !strings.Contains(logs, `"transport":"tcp","reason":"verbs unavailable: no RDMA devices (test)"`) ||
			!strings.Contains(logs, `"nics":2`) {
			t.Fatalf("selection not logged with its reason:\n%s", logs)
		}
		v, err := n.admin.Version(ctxT(t), &pegadv1.VersionRequest{})
		if err != nil || v.GetTransport() != "tcp" || v.GetVerbsAvailable() {
			t.Fatalf("version %v %v", v, err)
		}
	})
}

// TestRunStopsOnCancel: Run returns nil when its context ends.
func TestRunStopsOnCancel(t *testing.T) {
	cfg := testConfig(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- daemon.Run(ctx, cfg, daemon.WithLogger(zerolog.Nop()), daemon.WithNotify(func(string) {}))
	}()
	eventually(t, "socket", 10*time.Second, func() bool {
		c, err := net.Dial("unix", cfg.Socket)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
}

// TestTwoNodePrefetch: node B fetches node A's blocks over the tcp
// transport and gets identical bytes; A's session is released.
func TestTwoNodePrefetch(t *testing.T) {
	a := startNode(t, testConfig(t))
	b := startNode(t, testConfig(t))
	ctx := ctxT(t)
	want := map[byte][]byte{1: pattern(2<<20+5, 1), 2: pattern(333, 2)}
	for h, body := range want {
		putBlock(t, a, "ns", []byte{h}, body, h == 1)
	}
	resp, err := b.local.Prefetch(ctx, &pegadv1.PrefetchRequest{Peer: a.d.PeerAddr(), Namespace: "ns",
		Hashes: [][]byte{{1}, {2}, {3}}})
	if err != nil {
		t.Fatalf("prefetch: %v\nA logs:\n%s\nB logs:\n%s", err, a.logs, b.logs)
	}
	st := map[byte]pegadv1.PrefetchBlockStatus{}
	for _, r := range resp.GetBlocks() {
		st[r.GetHash()[0]] = r.GetStatus()
	}
	if st[1] != pegadv1.PrefetchBlockStatus_PREFETCH_BLOCK_STATUS_FETCHED ||
		st[2] != pegadv1.PrefetchBlockStatus_PREFETCH_BLOCK_STATUS_FETCHED ||
		st[3] != pegadv1.PrefetchBlockStatus_PREFETCH_BLOCK_STATUS_MISSING_ON_PEER {
		t.Fatalf("statuses %v", resp)
	}
	for h, body := range want {
		if got := getBlock(t, b, "ns", []byte{h}); !bytes.Equal(got, body) {
			t.Fatalf("block %d on B differs from A's", h)
		}
	}
	eventually(t, "A's session released", 5*time.Second, func() bool {
		ls, err := a.admin.ListSessions(ctx, &pegadv1.ListSessionsRequest{})
		return err == nil && len(ls.GetSessions()) == 0
	})
	conns, err := b.admin.ListConns(ctx, &pegadv1.ListConnsRequest{})
	if err != nil || len(conns.GetConns()) != 1 || conns.GetConns()[0].GetQps() != uint32(b.d.Config().QPsPerPeer) {
		t.Fatalf("B conns: %v %v", conns, err)
	}
	if v := metric(t, b.d.MetricsAddr(), `pegaflow_rdma_fetch_total{status="ok"}`); v != 1 {
		t.Fatalf("fetch ok %v", v)
	}
	if v := metric(t, b.d.MetricsAddr(), "pegaflow_rdma_qps"); v != float64(b.d.Config().QPsPerPeer) {
		t.Fatalf("rdma_qps %v", v)
	}
	for _, n := range []*node{b, a} {
		if err := n.d.Close(); err != nil {
			t.Fatal(fmt.Errorf("close %s: %w", n.d.Config().NodeID, err))
		}
	}
}

// TestGracefulShutdown: Close lets an in-flight RPC finish; past
// shutdown-timeout it cuts one that does not.
func TestGracefulShutdown(t *testing.T) {
	t.Run("drains", func(t *testing.T) {
		n := startNode(t, testConfig(t))
		s, err := n.local.PutBlock(ctxT(t))
		if err != nil {
			t.Fatal(err)
		}
		body := pattern(64<<10, 5)
		send := func(m *pegadv1.PutBlockRequest) {
			t.Helper()
			if err := s.Send(m); err != nil {
				t.Fatal(err)
			}
		}
		send(&pegadv1.PutBlockRequest{Msg: &pegadv1.PutBlockRequest_Header{Header: &pegadv1.PutBlockHeader{
			Namespace: "ns", Hash: []byte{1}, Slots: []*pegadv1.SlotSize{{KSize: uint64(len(body))}}}}})
		send(&pegadv1.PutBlockRequest{Msg: &pegadv1.PutBlockRequest_Data{Data: body[:1000]}})
		closed := make(chan error, 1)
		go func() { closed <- n.d.Close() }()
		// Shutdown has begun: health says so; the put is still open.
		eventually(t, "NOT_SERVING", 5*time.Second, func() bool {
			r, err := n.lh.Check(ctxT(t), &healthpb.HealthCheckRequest{})
			return err != nil || r.GetStatus() == healthpb.HealthCheckResponse_NOT_SERVING
		})
		select {
		case err := <-closed:
			t.Fatalf("Close returned (%v) with an RPC in flight", err)
		default:
		}
		send(&pegadv1.PutBlockRequest{Msg: &pegadv1.PutBlockRequest_Data{Data: body[1000:]}})
		resp, err := s.CloseAndRecv()
		if err != nil || resp.GetBytes() != uint64(len(body)) {
			t.Fatalf("in-flight put during shutdown: %v, %v", resp, err)
		}
		if err := <-closed; err != nil {
			t.Fatal(err)
		}
	})
	t.Run("cuts at the timeout", func(t *testing.T) {
		cfg := testConfig(t)
		cfg.ShutdownTimeout = 300 * time.Millisecond
		n := startNode(t, cfg)
		s, err := n.local.PutBlock(ctxT(t))
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Send(&pegadv1.PutBlockRequest{Msg: &pegadv1.PutBlockRequest_Header{Header: &pegadv1.PutBlockHeader{
			Namespace: "ns", Hash: []byte{1}, Slots: []*pegadv1.SlotSize{{KSize: 10}}}}}); err != nil {
			t.Fatal(err)
		}
		eventually(t, "put in flight", 5*time.Second, func() bool {
			return strings.Contains(cluster.ScrapeText(n.d.MetricsAddr()), `grpc_server_msg_received_total{grpc_method="PutBlock"`)
		})
		start := time.Now()
		if err := n.d.Close(); err != nil {
			t.Fatal(err)
		}
		if el := time.Since(start); el > 3*time.Second {
			t.Fatalf("Close took %v with a 300ms shutdown-timeout", el)
		}
		if _, err := s.CloseAndRecv(); err == nil {
			t.Fatal("a stalled put survived a hard stop")
		}
		if got := n.d.StoreBlocks(); got != 0 {
			t.Fatalf("a cut put stored %d blocks", got)
		}
	})
}

// TestWatchdog: with WATCHDOG_USEC set (as systemd does), pegad pings.
func TestWatchdog(t *testing.T) {
	t.Setenv("WATCHDOG_USEC", "100000")
	t.Setenv("WATCHDOG_PID", strconv.Itoa(os.Getpid()))
	var mu sync.Mutex
	var notes []string
	startNode(t, testConfig(t), daemon.WithNotify(func(s string) { mu.Lock(); notes = append(notes, s); mu.Unlock() }))
	eventually(t, "watchdog ping", 5*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, s := range notes {
			if s == "WATCHDOG=1" {
				return true
			}
		}
		return false
	})
}

// TestUnknownEnvWarned: a misspelt PEGAD_ variable is logged, not ignored
// silently.
func TestUnknownEnvWarned(t *testing.T) {
	t.Setenv("PEGAD_POOLSIZE", "1GiB")
	n := startNode(t, testConfig(t))
	if !strings.Contains(n.logs.String(), `"env":"PEGAD_POOLSIZE"`) {
		t.Fatalf("unknown env not warned:\n%s", n.logs)
	}
}
