package bench

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/internal/holder"
	"github.com/pegaflow/pegad/internal/metrics/metricstest"
	"github.com/pegaflow/pegad/internal/pool"
	"github.com/pegaflow/pegad/internal/store"
)

// newStore is a store over a pool of size bytes holding n one-slot blocks
// of blockSize bytes in namespace "bench", and their hashes (32 bytes, like
// a sha256 prefix hash).
func newStore(b *testing.B, size uint64, n, blockSize int) (*store.Store, [][]byte) {
	b.Helper()
	p, err := pool.New(pool.Options{Size: size, Log: zerolog.Nop()})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = p.Close() })
	s := store.New(p, metricstest.New())
	hashes := make([][]byte, n)
	for i := range hashes {
		hashes[i] = fmt.Appendf(nil, "%032x", i)
		if _, err := s.Put(store.Key{Namespace: "bench", Hash: string(hashes[i])},
			[]store.SlotSize{{KSize: uint64(blockSize)}}, func(buf []byte) error {
				copy(buf, pattern(len(buf), byte(i)))
				return nil
			}); err != nil {
			b.Fatal(err)
		}
	}
	return s, hashes
}

// echo is a unary service answering every call with a canned message: the
// baseline for the holder's RPCs, carrying the same bytes both ways over
// the same kind of server and connection, with no work behind it.
type echo struct {
	query   *pegadv1.QueryBlocksForTransferResponse
	release *pegadv1.ReleaseTransferLockResponse
}

const echoService = "pegad.bench.Echo"

// echoMethod is a grpc.MethodDesc that decodes a request of type Req and
// answers resp(srv), through the server's interceptor like generated code.
func echoMethod[Req any, PReq interface {
	*Req
	proto.Message
}](name string, resp func(*echo) proto.Message) grpc.MethodDesc {
	return grpc.MethodDesc{MethodName: name, Handler: func(srv any, ctx context.Context, dec func(any) error, icp grpc.UnaryServerInterceptor) (any, error) {
		in := PReq(new(Req))
		if err := dec(in); err != nil {
			return nil, err
		}
		h := func(context.Context, any) (any, error) { return resp(srv.(*echo)), nil }
		if icp == nil {
			return h(ctx, in)
		}
		return icp(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: "/" + echoService + "/" + name}, h)
	}}
}

var echoDesc = grpc.ServiceDesc{
	ServiceName: echoService,
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{
		echoMethod[pegadv1.QueryBlocksForTransferRequest]("Query", func(e *echo) proto.Message { return e.query }),
		echoMethod[pegadv1.ReleaseTransferLockRequest]("Release", func(e *echo) proto.Message { return e.release }),
	},
}

// BenchmarkLockVsEcho: one QueryBlocksForTransfer (32 blocks found, pinned,
// session opened) + ReleaseTransferLock round trip against the holder over
// a real store, next to two calls of a bare echo service answering the same
// responses, both registered on one gRPC server on 127.0.0.1:0 and called
// over one client connection, alternating in every iteration. Reports
// lock-ns/op, echo-ns/op and lock-ratio (subject/baseline; lower is better,
// 1 would mean the holder's work costs nothing next to gRPC).
func BenchmarkLockVsEcho(b *testing.B) {
	const blocks = 32
	st, hashes := newStore(b, 16<<20, blocks, 64<<10)
	svc, cc, e := holderWithEcho(b, st)
	pc := pegadv1.NewPeerServiceClient(cc)

	ctx := context.Background()
	who := &pegadv1.Requester{NodeId: "bench-requester", Incarnation: "r1"}
	qreq := &pegadv1.QueryBlocksForTransferRequest{Namespace: "bench", Hashes: hashes, Requester: who}
	lock := func() (*pegadv1.QueryBlocksForTransferResponse, *pegadv1.ReleaseTransferLockResponse) {
		q, err := pc.QueryBlocksForTransfer(ctx, qreq)
		if err != nil || len(q.GetBlocks()) != blocks {
			b.Fatalf("query: %d blocks, %v", len(q.GetBlocks()), err)
		}
		r, err := pc.ReleaseTransferLock(ctx, &pegadv1.ReleaseTransferLockRequest{SessionId: q.GetSessionId(), Requester: who})
		if err != nil || !r.GetWasLive() {
			b.Fatalf("release: was_live %v, %v", r.GetWasLive(), err)
		}
		return q, r
	}
	// The echo answers what the holder answered (same sizes on the wire).
	e.query, e.release = lock()
	rreq := &pegadv1.ReleaseTransferLockRequest{SessionId: e.query.GetSessionId(), Requester: who}
	q, r := new(pegadv1.QueryBlocksForTransferResponse), new(pegadv1.ReleaseTransferLockResponse)
	echoCall := func() {
		if err := cc.Invoke(ctx, "/"+echoService+"/Query", qreq, q); err != nil || len(q.GetBlocks()) != blocks {
			b.Fatalf("echo query: %v", err)
		}
		if err := cc.Invoke(ctx, "/"+echoService+"/Release", rreq, r); err != nil {
			b.Fatalf("echo release: %v", err)
		}
	}
	echoCall() // warm up

	var subj, base clock
	for b.Loop() {
		subj.time(func() { lock() })
		base.time(echoCall)
	}
	reportLatency(b, "lock", "echo", &subj, &base)
	if n := svc.Locks().Len(); n != 0 {
		b.Fatalf("%d sessions left live", n)
	}
}

// BenchmarkExpireScaling: LockTable.ExpireBefore ending 10 expired sessions
// among 100,000 live ones, next to the same among 1,000 live ones, each in
// every iteration (the 10 are opened before each call, outside the timing).
// Reports live100k-ns/op, live1k-ns/op and live100k-ratio: ≈1 when expiry
// costs O(expired), not O(live); 100 would be a full scan.
func BenchmarkExpireScaling(b *testing.B) {
	const expiring = 10
	type table struct {
		svc   *holder.Service
		clock *clock
	}
	var now atomic.Int64 // fake time, unix ns, shared by both tables
	base := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	nowFn := func() time.Time { return time.Unix(0, now.Load()) }
	const timeout = time.Minute
	ctx := context.Background()
	open := func(svc *holder.Service, node string, hash []byte) {
		q, err := svc.QueryBlocksForTransfer(ctx, &pegadv1.QueryBlocksForTransferRequest{
			Namespace: "bench", Hashes: [][]byte{hash}, Requester: &pegadv1.Requester{NodeId: node, Incarnation: "1"}})
		if err != nil || q.GetSessionId() == "" {
			b.Fatalf("query: %v", err)
		}
	}
	mk := func(live int) table {
		st, hashes := newStore(b, 4<<20, 1, 4096)
		svc := newHolder(b, holder.Options{Store: st, Log: zerolog.Nop(), LockTimeout: timeout, Now: nowFn})
		b.Cleanup(func() { svc.Locks().ReleaseAll("benchmark done") })
		now.Store(base.Add(time.Hour).UnixNano()) // live ones expire long after the test's "now"
		for i := range live {
			open(svc, fmt.Sprintf("live-%d", i%256), hashes[0])
		}
		return table{svc: svc, clock: new(clock)}
	}
	big, small := mk(100_000), mk(1_000)
	hash := fmt.Appendf(nil, "%032x", 0)
	expireAt := base.Add(timeout)
	iter := func(t table) {
		now.Store(base.UnixNano())
		for i := range expiring {
			open(t.svc, fmt.Sprintf("expiring-%d", i), hash)
		}
		t.clock.time(func() {
			if n := t.svc.Locks().ExpireBefore(expireAt); n != expiring {
				b.Fatalf("expired %d, want %d", n, expiring)
			}
		})
	}
	for i := 0; b.Loop(); i++ {
		if i%2 == 0 { // alternate the order: neither side always runs second
			iter(big)
			iter(small)
		} else {
			iter(small)
			iter(big)
		}
	}
	reportLatency(b, "live100k", "live1k", big.clock, small.clock)
}
