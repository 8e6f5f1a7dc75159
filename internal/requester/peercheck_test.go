package requester

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/internal/conn"
	"github.com/pegaflow/pegad/internal/index"
	"github.com/pegaflow/pegad/internal/metrics"
	"github.com/pegaflow/pegad/internal/metrics/metricstest"
)

// fakeNodes is a cluster index's membership.
type fakeNodes struct {
	addrs []string
	err   error
}

func (n fakeNodes) Nodes(context.Context) ([]index.Node, error) {
	var out []index.Node
	for _, a := range n.addrs {
		out = append(out, index.Node{ID: a, Addr: a})
	}
	return out, n.err
}

// recordingHolder is a fake holder that keeps what each lock query and
// release said of the handoff.
type recordingHolder struct {
	*fakeHolder
	mu       sync.Mutex // guards tokens, complete, ended
	tokens   []string
	complete []bool
	ended    []string // the tokens of EndHandoff calls
}

func (r *recordingHolder) EndHandoff(_ context.Context, in *pegadv1.EndHandoffRequest, _ ...grpc.CallOption) (*pegadv1.EndHandoffResponse, error) {
	r.mu.Lock()
	r.ended = append(r.ended, in.GetToken())
	r.mu.Unlock()
	return &pegadv1.EndHandoffResponse{Ended: true}, nil
}

func (r *recordingHolder) endedTokens() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.ended...)
}

func (r *recordingHolder) QueryBlocksForTransfer(ctx context.Context, in *pegadv1.QueryBlocksForTransferRequest, o ...grpc.CallOption) (*pegadv1.QueryBlocksForTransferResponse, error) {
	r.mu.Lock()
	r.tokens = append(r.tokens, in.GetHandoffToken())
	r.mu.Unlock()
	return r.fakeHolder.QueryBlocksForTransfer(ctx, in, o...)
}

func (r *recordingHolder) ReleaseTransferLock(ctx context.Context, in *pegadv1.ReleaseTransferLockRequest, o ...grpc.CallOption) (*pegadv1.ReleaseTransferLockResponse, error) {
	r.mu.Lock()
	r.complete = append(r.complete, in.GetReadComplete())
	r.mu.Unlock()
	return r.fakeHolder.ReleaseTransferLock(ctx, in, o...)
}

func newPeerCheckHarness(t *testing.T, o ClusterOptions) (*Cluster, *recordingHolder) {
	c, rh, _ := newPeerCheckHarnessHS(t, o)
	return c, rh
}

func newPeerCheckHarnessHS(t *testing.T, o ClusterOptions) (*Cluster, *recordingHolder, *harness) {
	t.Helper()
	rh := &recordingHolder{fakeHolder: holderSet(map[string][]string{"n1": {"a", "b"}})["n1"]}
	hs := newHarness(t, withOpts(func(opts *Options) {
		opts.Peers = func(addr string) (pegadv1.PeerServiceClient, error) {
			if addr != "n1:1" {
				return nil, fmt.Errorf("no peer %s", addr)
			}
			return rh, nil
		}
	}))
	c, err := NewCluster(hs.e, o)
	if err != nil {
		t.Fatal(err)
	}
	return c, rh, hs
}

// TestKnownPeerOnly: a peer is dialed only when the index lists it or
// the peer port's mTLS checks it; a refusal sends nothing and is counted
// by reason.
func TestKnownPeerOnly(t *testing.T) {
	for _, tc := range []struct {
		name     string
		nodes    NodeLister
		verified bool
		refused  string // reason; "": admitted
	}{
		{"no index, no allow-list", nil, false, metrics.RefusedNoCheck},
		{"mTLS checks it", nil, true, ""},
		{"listed", fakeNodes{addrs: []string{"n2:1", "n1:1"}}, false, ""},
		{"not listed", fakeNodes{addrs: []string{"n2:1"}}, false, metrics.RefusedNotInIndex},
		{"index down", fakeNodes{err: fmt.Errorf("%w: dial", index.ErrUnavailable)}, false, metrics.RefusedIndexDown},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pd := metricstest.NewPD()
			c, rh := newPeerCheckHarness(t, ClusterOptions{Nodes: tc.nodes, PeersVerified: tc.verified, PD: pd})
			res, err := c.Fetch(context.Background(), Request{Peer: "n1:1", Namespace: "ns", Hashes: [][]byte{[]byte("a")}, KnownPeerOnly: true})
			if tc.refused == "" {
				if err != nil || res.Blocks[0].Status != StatusFetched {
					t.Fatalf("Fetch = %+v, %v; want fetched", res, err)
				}
				return
			}
			if !errors.Is(err, ErrUnknownPeer) || !strings.Contains(err.Error(), "n1:1") || res != nil {
				t.Fatalf("Fetch = %+v, %v; want ErrUnknownPeer naming n1:1", res, err)
			}
			if got := testutil.ToFloat64(pd.PeerRefusals.WithLabelValues(tc.refused)); got != 1 {
				t.Fatalf("refusals{%s} = %v", tc.refused, got)
			}
			if len(rh.tokens) != 0 {
				t.Fatalf("a refused peer got %d queries", len(rh.tokens))
			}
		})
	}
	t.Run("engine alone refuses", func(t *testing.T) {
		c, rh := newPeerCheckHarness(t, ClusterOptions{PeersVerified: true, PD: metricstest.NewPD()})
		_, err := c.Engine.Fetch(context.Background(), Request{Peer: "n1:1", Namespace: "ns", Hashes: [][]byte{[]byte("a")}, KnownPeerOnly: true})
		if !errors.Is(err, ErrUnknownPeer) || len(rh.tokens) != 0 {
			t.Fatalf("Engine.Fetch with KnownPeerOnly = %v (%d queries), want ErrUnknownPeer and none", err, len(rh.tokens))
		}
	})
}

// TestHandoffTokenSent: every lock query carries the handoff token, the
// release after a complete read says so, and the pull's bytes count.
func TestHandoffTokenSent(t *testing.T) {
	pd := metricstest.NewPD()
	c, rh := newPeerCheckHarness(t, ClusterOptions{PD: pd})
	res, err := c.Fetch(context.Background(), Request{Peer: "n1:1", Namespace: "ns", Hashes: [][]byte{[]byte("a"), []byte("b")}, Handoff: "tok"})
	if err != nil {
		t.Fatal(err)
	}
	rh.mu.Lock()
	defer rh.mu.Unlock()
	if len(rh.tokens) == 0 || len(rh.complete) != len(rh.tokens) {
		t.Fatalf("queries %v, releases %v", rh.tokens, rh.complete)
	}
	for i := range rh.tokens {
		if rh.tokens[i] != "tok" || !rh.complete[i] {
			t.Fatalf("query %d: token %q, read_complete %v", i, rh.tokens[i], rh.complete[i])
		}
	}
	if got := testutil.ToFloat64(pd.PullBytes); got != float64(res.Bytes) || got == 0 {
		t.Fatalf("pull bytes = %v, fetched %d", got, res.Bytes)
	}
}

// TestHandoffNotCompletedByAFailedRead: a window whose READ failed is
// released without read_complete, so the holder keeps the handoff's pins.
func TestHandoffNotCompletedByAFailedRead(t *testing.T) {
	c, rh, hs := newPeerCheckHarnessHS(t, ClusterOptions{PD: metricstest.NewPD()})
	hs.cs.r.read = func(context.Context, []conn.ReadOp) error { return fmt.Errorf("%w: cut", conn.ErrConnectionBroken) }
	if _, err := c.Fetch(context.Background(), Request{Peer: "n1:1", Namespace: "ns", Hashes: [][]byte{[]byte("a")}, Handoff: "tok"}); err == nil {
		t.Fatal("Fetch succeeded though its read failed")
	}
	rh.mu.Lock()
	defer rh.mu.Unlock()
	if len(rh.complete) == 0 {
		t.Fatal("the session was not released")
	}
	for i, done := range rh.complete {
		if done {
			t.Fatalf("release %d said read_complete after a failed read", i)
		}
	}
}

// TestEndHandoff: a fetch with EndHandoff tells the holder once, after
// its read, that the consumer is done with the handoff; without it, or
// with a peer refused before anything is sent, the holder hears nothing.
func TestEndHandoff(t *testing.T) {
	for _, tc := range []struct {
		name   string
		end    bool
		nodes  NodeLister
		hashes []string
		want   int // EndHandoff calls
	}{
		{"done with it", true, fakeNodes{addrs: []string{"n1:1"}}, []string{"a"}, 1},
		{"the holder has none of them", true, fakeNodes{addrs: []string{"n1:1"}}, []string{"zz"}, 1},
		{"not asked", false, fakeNodes{addrs: []string{"n1:1"}}, []string{"a"}, 0},
		{"peer refused", true, fakeNodes{addrs: []string{"n2:1"}}, []string{"a"}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, rh, hs := newPeerCheckHarnessHS(t, ClusterOptions{Nodes: tc.nodes, PD: metricstest.NewPD()})
			hashes := make([][]byte, len(tc.hashes))
			for i, h := range tc.hashes {
				hashes[i] = []byte(h)
			}
			_, _ = c.Fetch(context.Background(), Request{Peer: "n1:1", Namespace: "ns", Hashes: hashes,
				Handoff: "tok", KnownPeerOnly: true, EndHandoff: tc.end})
			if err := hs.e.Close(); err != nil { // waits for the engine's EndHandoff goroutine
				t.Fatal(err)
			}
			got := rh.endedTokens()
			if len(got) != tc.want || (tc.want > 0 && got[0] != "tok") {
				t.Fatalf("EndHandoff calls = %q, want %d with token tok", got, tc.want)
			}
		})
	}
}
