package integration

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/internal/config"
	"github.com/pegaflow/pegad/internal/daemon"
	"github.com/pegaflow/pegad/internal/testutil"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// httpc scrapes /metrics without keep-alives, so no client goroutine
// outlives a test (goleak).
var httpc = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}

// baseConfig is a loopback tcp-transport node with ephemeral ports.
func baseConfig(t testing.TB, nodeID string) config.Config {
	t.Helper()
	c := config.Default()
	c.NodeID = nodeID
	c.Listen = "127.0.0.1:0"
	c.MetricsListen = "127.0.0.1:0"
	c.Socket = filepath.Join(t.TempDir(), "pegad.sock")
	c.PoolSize = 32 << 20
	c.Transport = config.TransportTCP
	c.TCPDataListen = "127.0.0.1:0"
	c.LockTimeout = 3 * time.Second
	c.GCInterval = 50 * time.Millisecond
	c.ShutdownTimeout = 5 * time.Second
	return c
}

// node is a running daemon and clients of its local socket.
type node struct {
	d     *daemon.Daemon
	cfg   config.Config
	logs  *testutil.LogBuffer
	cc    *grpc.ClientConn
	local pegadv1.LocalServiceClient
	admin pegadv1.AdminServiceClient

	closeOnce sync.Once
	closeErr  error
}

// start starts a daemon; it is closed at cleanup unless closed before.
func start(t *testing.T, cfg config.Config, opts ...daemon.Option) *node {
	t.Helper()
	logs := &testutil.LogBuffer{}
	opts = append([]daemon.Option{
		daemon.WithLogger(zerolog.New(logs).Level(zerolog.InfoLevel).With().Timestamp().Logger()),
		daemon.WithNotify(func(string) {}),
	}, opts...)
	d, err := daemon.Start(context.Background(), cfg, opts...)
	if err != nil {
		t.Fatalf("start %s: %v\n%s", cfg.NodeID, err, logs)
	}
	cc, err := grpc.NewClient("unix://"+d.SocketPath(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		_ = d.Close()
		t.Fatal(err)
	}
	n := &node{d: d, cfg: d.Config(), logs: logs, cc: cc,
		local: pegadv1.NewLocalServiceClient(cc), admin: pegadv1.NewAdminServiceClient(cc)}
	t.Cleanup(func() {
		if err := n.close(); err != nil {
			t.Errorf("close %s: %v", cfg.NodeID, err)
		}
	})
	return n
}

// close stops the daemon and its clients (idempotent).
func (n *node) close() error {
	n.closeOnce.Do(func() {
		n.closeErr = errors.Join(n.cc.Close(), n.d.Close())
	})
	return n.closeErr
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// block is one test block: its hash, bytes, and whether it is K/V split.
type block struct {
	hash []byte
	body []byte
	kv   bool
}

// randomBlocks makes n blocks of random sizes in [minLen, maxLen], about
// half of them K/V split, with random content.
func randomBlocks(rng *rand.Rand, prefix string, n, minLen, maxLen int) []block {
	out := make([]block, n)
	for i := range out {
		size := minLen + rng.IntN(maxLen-minLen+1)
		body := make([]byte, size)
		for j := 0; j < size; j += 8 {
			v := rng.Uint64()
			for k := 0; k < 8 && j+k < size; k++ {
				body[j+k] = byte(v >> (8 * k))
			}
		}
		out[i] = block{hash: []byte(fmt.Sprintf("%s-%05d", prefix, i)), body: body, kv: size >= 2 && rng.IntN(2) == 0}
	}
	return out
}

// put stores b on n through the local API.
func put(ctx context.Context, n *node, ns string, b block) error {
	s, err := n.local.PutBlock(ctx)
	if err != nil {
		return err
	}
	slot := &pegadv1.SlotSize{KSize: uint64(len(b.body))}
	if b.kv {
		slot = &pegadv1.SlotSize{KSize: uint64(len(b.body) / 2), VSize: uint64(len(b.body) - len(b.body)/2)}
	}
	if err := s.Send(&pegadv1.PutBlockRequest{Msg: &pegadv1.PutBlockRequest_Header{Header: &pegadv1.PutBlockHeader{
		Namespace: ns, Hash: b.hash, Slots: []*pegadv1.SlotSize{slot}}}}); err != nil {
		return err
	}
	for rest := b.body; len(rest) > 0; {
		k := min(len(rest), 1<<20)
		if err := s.Send(&pegadv1.PutBlockRequest{Msg: &pegadv1.PutBlockRequest_Data{Data: rest[:k]}}); err != nil {
			return err
		}
		rest = rest[k:]
	}
	resp, err := s.CloseAndRecv()
	if err != nil {
		return err
	}
	if resp.GetBytes() != uint64(len(b.body)) {
		return fmt.Errorf("put %s: %d bytes stored, want %d", b.hash, resp.GetBytes(), len(b.body))
	}
	return nil
}

func putAll(t *testing.T, n *node, ns string, blocks []block) {
	t.Helper()
	ctx := ctxT(t, 60*time.Second)
	for _, b := range blocks {
		if err := put(ctx, n, ns, b); err != nil {
			t.Fatalf("put %s on %s: %v", b.hash, n.cfg.NodeID, err)
		}
	}
}

// get reads a block through the local API.
func get(ctx context.Context, n *node, ns string, hash []byte) ([]byte, error) {
	s, err := n.local.GetBlock(ctx, &pegadv1.GetBlockRequest{Namespace: ns, Hash: hash})
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	for {
		m, err := s.Recv()
		if errors.Is(err, io.EOF) {
			return buf.Bytes(), nil
		}
		if err != nil {
			return nil, err
		}
		buf.Write(m.GetData())
	}
}

// scrape returns the samples of n's /metrics as "name{labels}" → value.
func scrape(t *testing.T, n *node) map[string]float64 {
	t.Helper()
	resp, err := httpc.Get("http://" + n.d.MetricsAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("metrics line %q: %v", line, err)
		}
		out[line[:i]] = v
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// Sample names the tests read.
const (
	mQueryOK         = `pegaflow_holder_rpc_total{code="OK",rpc="query_blocks_for_transfer"}`
	mReleaseOK       = `pegaflow_holder_rpc_total{code="OK",rpc="release_transfer_lock"}`
	mSessionsActive  = `pegaflow_transfer_sessions_active`
	mLockActive      = `pegaflow_transfer_lock_active`
	mLockTimeouts    = `pegaflow_transfer_lock_timeouts_total`
	mReclaims        = `pegaflow_transfer_lock_incarnation_reclaims_total`
	mForceReleases   = `pegaflow_transfer_lock_force_releases_total`
	mGuardAborts     = `pegaflow_transfer_lock_guard_aborts_total`
	mGuardRelFails   = `pegaflow_transfer_lock_guard_release_failures_total`
	mRDMAQPs         = `pegaflow_rdma_qps`
	mSessionWorkers  = `pegaflow_session_workers`
	mQuarantined     = `pegaflow_rdma_staging_quarantined_bytes`
	mEvictions       = `pegaflow_block_evictions_total`
	mFetchesInFlight = `pegaflow_rdma_fetches_in_flight`
)

func eventually(t *testing.T, what string, timeout time.Duration, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s: %v", timeout, what, err)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// prefetch asks n to fetch hashes of ns from peer.
func prefetch(ctx context.Context, n *node, peer, ns string, hashes ...[]byte) (*pegadv1.PrefetchResponse, error) {
	return n.local.Prefetch(ctx, &pegadv1.PrefetchRequest{Peer: peer, Namespace: ns, Hashes: hashes})
}

const statusFetched = pegadv1.PrefetchBlockStatus_PREFETCH_BLOCK_STATUS_FETCHED
