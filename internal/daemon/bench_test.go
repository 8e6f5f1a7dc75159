package daemon_test

import (
	"context"
	"fmt"
	"testing"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/internal/config"
	"github.com/pegaflow/pegad/internal/daemon"
	"github.com/pegaflow/pegad/internal/testutil/cluster"
)

// benchNode starts a daemon for a benchmark (info-level logs kept by the
// cluster package).
func benchNode(b *testing.B) (*daemon.Daemon, pegadv1.LocalServiceClient, pegadv1.PeerServiceClient) {
	b.Helper()
	cfg := testConfig(b)
	cfg.PoolSize = 256 << 20
	n := cluster.Start(b, cluster.Named(cfg.NodeID), cluster.WithConfig(func(c *config.Config) { *c = cfg }))
	return n.Daemon(), n.Local, n.Peer
}

func benchPut(b *testing.B, c pegadv1.LocalServiceClient, hash []byte, body []byte) {
	s, err := c.PutBlock(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	if err := s.Send(&pegadv1.PutBlockRequest{Msg: &pegadv1.PutBlockRequest_Header{Header: &pegadv1.PutBlockHeader{
		Namespace: "bench", Hash: hash, Slots: []*pegadv1.SlotSize{{KSize: uint64(len(body))}}}}}); err != nil {
		b.Fatal(err)
	}
	for p := body; len(p) > 0; {
		k := min(len(p), 1<<20)
		if err := s.Send(&pegadv1.PutBlockRequest{Msg: &pegadv1.PutBlockRequest_Data{Data: p[:k]}}); err != nil {
			b.Fatal(err)
		}
		p = p[k:]
	}
	if _, err := s.CloseAndRecv(); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkLocalPut: PutBlock over the unix socket (new key each time;
// the LRU evicts under pressure).
func BenchmarkLocalPut(b *testing.B) {
	for _, size := range []int{64 << 10, 4 << 20} {
		b.Run(fmt.Sprintf("size=%dKiB", size>>10), func(b *testing.B) {
			_, lc, _ := benchNode(b)
			body := pattern(size, 1)
			b.SetBytes(int64(size))
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				benchPut(b, lc, []byte(fmt.Sprintf("%016x", i)), body)
			}
		})
	}
}

// BenchmarkLocalGet: GetBlock over the unix socket.
func BenchmarkLocalGet(b *testing.B) {
	for _, size := range []int{64 << 10, 4 << 20} {
		b.Run(fmt.Sprintf("size=%dKiB", size>>10), func(b *testing.B) {
			_, lc, _ := benchNode(b)
			benchPut(b, lc, []byte{1}, pattern(size, 1))
			b.SetBytes(int64(size))
			for b.Loop() {
				s, err := lc.GetBlock(context.Background(), &pegadv1.GetBlockRequest{Namespace: "bench", Hash: []byte{1}})
				if err != nil {
					b.Fatal(err)
				}
				for {
					if _, err := s.Recv(); err != nil {
						break
					}
				}
			}
		})
	}
}

// BenchmarkLockRelease: one QueryBlocksForTransfer + ReleaseTransferLock
// round trip on the peer port for 32 blocks.
func BenchmarkLockRelease(b *testing.B) {
	_, lc, pc := benchNode(b)
	var hashes [][]byte
	for i := range 32 {
		h := []byte{byte(i), 0xbe}
		benchPut(b, lc, h, pattern(4096, byte(i)))
		hashes = append(hashes, h)
	}
	req := &pegadv1.Requester{NodeId: "bench", Incarnation: "1"}
	ctx := context.Background()
	for b.Loop() {
		q, err := pc.QueryBlocksForTransfer(ctx, &pegadv1.QueryBlocksForTransferRequest{Namespace: "bench", Hashes: hashes, Requester: req})
		if err != nil || len(q.GetBlocks()) != 32 {
			b.Fatalf("query: %v", err)
		}
		if _, err := pc.ReleaseTransferLock(ctx, &pegadv1.ReleaseTransferLockRequest{SessionId: q.GetSessionId(), Requester: req}); err != nil {
			b.Fatal(err)
		}
	}
}
