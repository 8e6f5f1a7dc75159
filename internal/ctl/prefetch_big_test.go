package ctl

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/api/pegaderr"
	pegaclient "github.com/pegaflow/pegad/client"
	"github.com/pegaflow/pegad/internal/config"
	"github.com/pegaflow/pegad/internal/testutil/cluster"
)

// deadPeer is a peer address nothing listens on.
func deadPeer(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	return addr
}

// cCoreHeaderLimit is the header-list limit gRPC's C core (what Python's
// grpcio runs on) advertises by default: a larger trailer is refused, and
// the server resets the stream instead of sending the call's status.
const cCoreHeaderLimit = 8 << 10

// TestPrefetchFailureOf4096Blocks (issue 33, item 5): a failed prefetch's
// per-block outcomes travelled only in the grpc-status-details-bin
// trailer, which grows with the block count: past a client's header-list
// limit the call ended in a bare RST_STREAM, outcomes and error both lost.
// They now travel in the response (failure_in_response), so a 4096-block
// failure reaches a client with the C core's limit intact; and a client
// that does not ask for that still gets the failure's status, its trailer
// bounded, with the outcomes left out and said so.
func TestPrefetchFailureOf4096Blocks(t *testing.T) {
	const n = 4096
	d := cluster.Start(t, cluster.Named("big-failure"), cluster.WithConfig(func(c *config.Config) { c.MetricsListen = "" }))
	peer := deadPeer(t)
	hashes := make([][]byte, n)
	hexes := make([]string, n)
	for i := range hashes {
		h := make([]byte, 64) // the longest hash: the largest answer
		h[0], h[1], h[2] = 0xfe, byte(i>>8), byte(i)
		hashes[i], hexes[i] = h, fmt.Sprintf("%x", h)
	}
	cc, err := grpc.NewClient("unix://"+d.SocketPath(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithMaxHeaderListSize(cCoreHeaderLimit))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	c, err := pegaclient.Dial(context.Background(), d.SocketPath(), pegaclient.WithConn(cc))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	res, err := c.Prefetch(ctx, "ns", hashes, pegaclient.FromPeer(peer))
	if !errors.Is(err, pegaclient.ErrUnavailable) || status.Code(err) != codes.Unavailable {
		t.Errorf("prefetch from a dead peer: %v, want ErrUnavailable", err)
	}
	if res == nil || len(res.Blocks) != n {
		got := -1
		if res != nil {
			got = len(res.Blocks)
		}
		t.Fatalf("Go client: %d per-block outcomes of a failed %d-block prefetch (err %v)", got, n, err)
	}
	for i, b := range res.Blocks {
		if b.Status != pegadv1.PrefetchBlockStatus_PREFETCH_BLOCK_STATUS_FAILED || b.Err == "" || !bytes.Equal(b.Hash, hashes[i]) {
			t.Fatalf("block %d: %v %q", i, b.Status, b.Err)
		}
	}

	// A client that does not ask for the outcomes in the response gets the
	// failure's own status, not a reset stream.
	_, err = pegadv1.NewLocalServiceClient(cc).Prefetch(ctx, &pegadv1.PrefetchRequest{Peer: peer, Namespace: "ns", Hashes: hashes})
	if code, reason := pegaderr.FromStatus(err); code != codes.Unavailable || reason != pegaderr.Connection ||
		!strings.Contains(status.Convert(err).Message(), "4096 per-block outcomes") {
		t.Errorf("legacy prefetch from a dead peer: %v (code %s, reason %q), want Unavailable, CONNECTION, outcomes left out",
			err, code, reason)
	}

	r := run(t, nil, append([]string{"--socket", d.SocketPath(), "-o", "json", "prefetch", "--peer", peer, "--namespace", "ns"}, hexes...)...)
	var out prefetchResult
	decodeJSON(t, r.stdout, &out)
	if len(out.Blocks) != n || out.Blocks[n-1].Status != "failed" || out.Blocks[n-1].Hash != hexes[n-1] {
		t.Errorf("pegactl printed %d outcomes of %d", len(out.Blocks), n)
	}
	wantError(t, r, ExitUnavailable, "")
}
