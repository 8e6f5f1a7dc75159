package daemon_test

import (
	"testing"
	"time"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/internal/ibv/tcp"
	"github.com/pegaflow/pegad/internal/testutil/cluster"
)

// TestFetchBytesCountedAsCompletionsArrive: during a slow fetch the
// requester's in-flight view shows bytes done rising below the total, and
// pegaflow_rdma_fetch_bytes_total rises before the fetch ends (it used to
// move only once the whole fetch finished).
func TestFetchBytesCountedAsCompletionsArrive(t *testing.T) {
	holder := startNode(t, testConfig(t))
	req := startNode(t, testConfig(t))
	const blocks, size = 12, 64 << 10
	var hashes [][]byte
	for i := range blocks {
		h := []byte{0xb0, byte(i)}
		putBlock(t, holder, "ns", h, make([]byte, size), false)
		hashes = append(hashes, h)
	}
	for _, d := range holder.d.TCPDevices() {
		d.SetFaults(tcp.Faults{ResponseDelay: 60 * time.Millisecond})
	}
	ctx := ctxT(t)
	done := make(chan error, 1)
	go func() {
		_, err := req.local.Prefetch(ctx, &pegadv1.PrefetchRequest{Peer: holder.d.PeerAddr(), Namespace: "ns", Hashes: hashes})
		done <- err
	}()
	var sawPartial, sawMetric bool
	for !sawPartial || !sawMetric {
		select {
		case err := <-done:
			t.Fatalf("fetch ended (err %v) before progress was seen: partial %v, metric %v", err, sawPartial, sawMetric)
		case <-time.After(10 * time.Millisecond):
		}
		res, err := req.admin.ListSessions(ctx, &pegadv1.ListSessionsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range res.GetFetches() {
			if f.GetBytesDone() > 0 && f.GetBytesDone() < f.GetBytes() {
				sawPartial = true
				if v := cluster.Scrape(t, req.d.MetricsAddr())["pegaflow_rdma_fetch_bytes_total"]; v > 0 && v < blocks*size {
					sawMetric = true
				}
			}
		}
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if v := cluster.Scrape(t, req.d.MetricsAddr())["pegaflow_rdma_fetch_bytes_total"]; v != blocks*size {
		t.Fatalf("fetch bytes after the fetch = %v, want %d", v, blocks*size)
	}
}

// TestHolderConnsNameTheRequester: on the holder, the connection a
// requester made carries its node id and advertised address (not only the
// ephemeral port its gRPC connection came from).
func TestHolderConnsNameTheRequester(t *testing.T) {
	holder := startNode(t, testConfig(t))
	req := startNode(t, testConfig(t))
	putBlock(t, holder, "ns", []byte{1}, []byte("x"), false)
	ctx := ctxT(t)
	if _, err := req.local.Prefetch(ctx, &pegadv1.PrefetchRequest{Peer: holder.d.PeerAddr(), Namespace: "ns", Hashes: [][]byte{{1}}}); err != nil {
		t.Fatal(err)
	}
	res, err := holder.admin.ListConns(ctx, &pegadv1.ListConnsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range res.GetConns() {
		if c.GetRole() == "holder" {
			if c.GetRemoteNodeId() != req.d.Config().NodeID || c.GetRemoteAdvertise() != req.d.PeerAddr() {
				t.Fatalf("holder row names node %q advertise %q, want %q %q", c.GetRemoteNodeId(), c.GetRemoteAdvertise(), req.d.Config().NodeID, req.d.PeerAddr())
			}
			return
		}
	}
	t.Fatalf("no holder row in %v", res.GetConns())
}
