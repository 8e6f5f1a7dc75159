package integration

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/internal/config"
	"github.com/pegaflow/pegad/internal/ctl"
	"github.com/pegaflow/pegad/internal/daemon"
	"github.com/pegaflow/pegad/internal/testutil"
	"github.com/pegaflow/pegad/internal/testutil/cluster"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// baseConfig is a loopback tcp-transport node with ephemeral ports.
func baseConfig(t testing.TB, nodeID string) config.Config {
	t.Helper()
	c := testutil.LoopbackConfig(nodeID, filepath.Join(t.TempDir(), "pegad.sock"))
	c.LockTimeout = 3 * time.Second
	return c
}

// node is a running daemon (a cluster.Node) with the fields these tests
// use.
type node struct {
	cn    *cluster.Node
	d     *daemon.Daemon
	cfg   config.Config
	logs  *testutil.LogBuffer
	cc    *grpc.ClientConn
	local pegadv1.LocalServiceClient
	admin pegadv1.AdminServiceClient
}

// start starts a daemon with cfg exactly; it is stopped at cleanup unless
// closed before.
func start(t *testing.T, cfg config.Config, opts ...daemon.Option) *node {
	t.Helper()
	n := cluster.Start(t, cluster.Named(cfg.NodeID), cluster.WithConfig(func(c *config.Config) { *c = cfg }),
		cluster.WithDaemonOptions(opts...))
	return &node{cn: n, d: n.Daemon(), cfg: n.Daemon().Config(), logs: n.Logs, cc: n.LocalConn, local: n.Local, admin: n.Admin}
}

// close stops the daemon and its clients (idempotent).
func (n *node) close() error { return n.cn.Stop() }

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
	resp, err := testutil.PutBlock(ctx, n.local, ns, b.hash, b.body, b.kv)
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
	return testutil.GetBlock(ctx, n.local, ns, hash)
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

// runPegactl runs pegactl in process against socket: its stdout, its
// stderr and its exit status.
func runPegactl(socket string, args ...string) (stdout, stderr string, code int) {
	var out, errb bytes.Buffer
	code = ctl.Main(context.Background(), append([]string{"--socket", socket}, args...),
		ctl.Streams{In: strings.NewReader(""), Out: &out, Err: &errb})
	return out.String(), errb.String(), code
}
