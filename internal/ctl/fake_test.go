package ctl

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
)

// fakeDaemon is an in-process LocalService + AdminService on a unix socket
// with canned admin answers and a real (map-backed) block store, so the
// CLI's requests and its handling of answers can be checked end to end.
type fakeDaemon struct {
	pegadv1.UnimplementedLocalServiceServer
	pegadv1.UnimplementedAdminServiceServer

	socket string

	mu sync.Mutex // guards everything below
	// blocks by namespace+"/"+hex(hash)
	blocks map[string]*fakeBlock
	// putCalls counts PutBlock streams; putChunks the data messages of the
	// last one and maxChunk the largest.
	putCalls  int
	putChunks int
	maxChunk  int
	// getTruncate, when > 0, makes GetBlock send that many bytes less.
	getTruncate int
	// errs makes the named method fail with that error.
	errs map[string]error
	// delay makes every admin call wait this long (or until cancelled).
	delay time.Duration

	lastPrefetch  *pegadv1.PrefetchRequest
	prefetchDelay time.Duration // Prefetch answers after this long
	prefetchRes   *pegadv1.PrefetchResponse
	lastRelease   *pegadv1.ReleaseLockRequest

	sessions *pegadv1.ListSessionsResponse
	conns    *pegadv1.ListConnsResponse
	stats    *pegadv1.StatsResponse
}

type fakeBlock struct {
	slots []*pegadv1.SlotSize
	data  []byte
}

var fakeCreated = time.Date(2026, 12, 2, 15, 0, 0, 0, time.UTC)

func startFake(t *testing.T) *fakeDaemon {
	t.Helper()
	// A short directory: unix socket paths are limited to 108 bytes and
	// t.TempDir() embeds the test name.
	dir, err := os.MkdirTemp("", "pegactl")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	f := &fakeDaemon{
		socket: filepath.Join(dir, "s.sock"),
		blocks: map[string]*fakeBlock{},
		errs:   map[string]error{},
		sessions: &pegadv1.ListSessionsResponse{
			Sessions: []*pegadv1.HolderSession{{
				SessionId:            "00112233445566778899aabbccddeeff",
				RequesterId:          "node-b",
				RequesterIncarnation: "inc-1",
				Blocks:               3,
				Bytes:                3 << 20,
				CreatedAt:            timestamppb.New(fakeCreated),
				Age:                  durationpb.New(1500 * time.Millisecond),
				ExpiresIn:            durationpb.New(118500 * time.Millisecond),
				Renewals:             1,
				Locked: []*pegadv1.LockedBlock{
					{Namespace: "llama", Hash: []byte{0x9f, 0x2c}, Bytes: 2 << 20},
					{Namespace: "llama", Hash: []byte{0x77}, Bytes: 1 << 20},
				},
			}},
			Fetches: []*pegadv1.Fetch{{
				ReqId: "req-7", Peer: "10.0.0.2:50055", SessionId: "ffee", Blocks: 2, Bytes: 4096,
				Age: durationpb.New(250 * time.Millisecond), Phase: "reading",
			}},
		},
		conns: &pegadv1.ListConnsResponse{Conns: []*pegadv1.Conn{{
			Peer: "127.0.0.1:50056", State: "connected", Qps: 4, Role: "requester", RemoteNodeId: "node-a",
			Age: durationpb.New(90 * time.Second),
			Nics: []*pegadv1.NicConn{
				{Nic: "tcp0", Qps: 2, LocalQpns: []uint32{100, 101}},
				{Nic: "tcp1", Qps: 2, LocalQpns: []uint32{200, 201}},
			},
		}}},
		stats: &pegadv1.StatsResponse{
			NodeId: "node-a", Incarnation: "inc-9", Transport: "tcp",
			PoolSize: 64 << 20, PoolUsed: 16 << 20, PoolFree: 48 << 20, PoolLocked: true,
			Blocks: 5, PinnedBlocks: 1, SessionsActive: 1, LockedBlocks: 3, LockTimeouts: 2,
			Evictions: 4, Qps: 4, Conns: 1, Uptime: durationpb.New(3*time.Minute + 500*time.Millisecond),
			FetchesOk: 10, FetchesFailed: 1, FetchBytes: 1 << 30,
			Lookups: 4, LookupHitBlocks: 30, LookupMissBlocks: 10, RecomputedBlocks: 6,
			Quotas: []*pegadv1.NamespaceQuota{{Prefix: "llama-70b", LimitBytes: 8 << 30, UsedBytes: 2 << 30, Blocks: 512, Evictions: 3, Refusals: 1}},
		},
	}
	lis, err := net.Listen("unix", f.socket)
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	pegadv1.RegisterLocalServiceServer(s, f)
	pegadv1.RegisterAdminServiceServer(s, f)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = s.Serve(lis)
	}()
	t.Cleanup(func() {
		s.Stop()
		<-done
	})
	return f
}

func (f *fakeDaemon) fail(method string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.errs[method]
}

func (f *fakeDaemon) wait(ctx context.Context) error {
	f.mu.Lock()
	d := f.delay
	f.mu.Unlock()
	if d == 0 {
		return nil
	}
	select {
	case <-time.After(d):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func blockKey(ns string, hash []byte) string { return fmt.Sprintf("%s/%x", ns, hash) }

func (f *fakeDaemon) block(ns string, hash []byte) *fakeBlock {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.blocks[blockKey(ns, hash)]
}

func (f *fakeDaemon) PutBlock(stream pegadv1.LocalService_PutBlockServer) error {
	f.mu.Lock()
	f.putCalls++
	f.putChunks, f.maxChunk = 0, 0
	f.mu.Unlock()
	if err := f.fail("PutBlock"); err != nil {
		return err
	}
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	hdr := first.GetHeader()
	if hdr == nil {
		return status.Error(codes.InvalidArgument, "first message must be the header")
	}
	var want uint64
	for _, s := range hdr.GetSlots() {
		want += s.GetKSize() + s.GetVSize()
	}
	var data []byte
	for {
		m, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		d := m.GetData()
		if d == nil {
			return status.Error(codes.InvalidArgument, "second header")
		}
		f.mu.Lock()
		f.putChunks++
		f.maxChunk = max(f.maxChunk, len(d))
		f.mu.Unlock()
		data = append(data, d...)
	}
	if uint64(len(data)) != want {
		return status.Errorf(codes.InvalidArgument, "block size mismatch: header says %d bytes, got %d", want, len(data))
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	key := blockKey(hdr.GetNamespace(), hdr.GetHash())
	if _, ok := f.blocks[key]; ok {
		return stream.SendAndClose(&pegadv1.PutBlockResponse{Bytes: want, Created: false})
	}
	f.blocks[key] = &fakeBlock{slots: hdr.GetSlots(), data: data}
	return stream.SendAndClose(&pegadv1.PutBlockResponse{Bytes: want, Created: true})
}

func (f *fakeDaemon) GetBlock(req *pegadv1.GetBlockRequest, stream pegadv1.LocalService_GetBlockServer) error {
	if err := f.fail("GetBlock"); err != nil {
		return err
	}
	b := f.block(req.GetNamespace(), req.GetHash())
	if b == nil {
		return status.Errorf(codes.NotFound, "block not found: namespace=%s hash=%x", req.GetNamespace(), req.GetHash())
	}
	f.mu.Lock()
	data := b.data[:len(b.data)-f.getTruncate]
	f.mu.Unlock()
	if err := stream.Send(&pegadv1.GetBlockResponse{Msg: &pegadv1.GetBlockResponse_Header{Header: &pegadv1.BlockInfo{
		Namespace: req.GetNamespace(), Hash: req.GetHash(), Slots: b.slots, Bytes: uint64(len(b.data)),
	}}}); err != nil {
		return err
	}
	for len(data) > 0 {
		n := min(len(data), 1<<20)
		if err := stream.Send(&pegadv1.GetBlockResponse{Msg: &pegadv1.GetBlockResponse_Data{Data: data[:n]}}); err != nil {
			return err
		}
		data = data[n:]
	}
	return nil
}

func (f *fakeDaemon) ListBlocks(ctx context.Context, req *pegadv1.ListBlocksRequest) (*pegadv1.ListBlocksResponse, error) {
	if err := f.fail("ListBlocks"); err != nil {
		return nil, err
	}
	return &pegadv1.ListBlocksResponse{
		Blocks: []*pegadv1.BlockInfo{{
			Namespace: req.GetNamespace(), Hash: []byte{0xab, 0xcd}, Bytes: 3072,
			Slots: []*pegadv1.SlotSize{{KSize: 1024, VSize: 512}, {KSize: 1024, VSize: 512}},
			Pins:  2, NumaNode: 1, CreatedAt: timestamppb.New(fakeCreated), LastAccess: timestamppb.New(fakeCreated.Add(time.Minute)),
		}},
		Truncated: req.GetLimit() == 1,
	}, nil
}

func (f *fakeDaemon) DeleteBlock(ctx context.Context, req *pegadv1.DeleteBlockRequest) (*pegadv1.DeleteBlockResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	key := blockKey(req.GetNamespace(), req.GetHash())
	if _, ok := f.blocks[key]; !ok {
		return nil, status.Errorf(codes.NotFound, "block not found: namespace=%s hash=%x", req.GetNamespace(), req.GetHash())
	}
	delete(f.blocks, key)
	return &pegadv1.DeleteBlockResponse{Deferred: true}, nil
}

func (f *fakeDaemon) Prefetch(ctx context.Context, req *pegadv1.PrefetchRequest) (*pegadv1.PrefetchResponse, error) {
	f.mu.Lock()
	d := f.prefetchDelay
	f.mu.Unlock()
	select {
	case <-time.After(d):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lastPrefetch = req
	if err := f.errs["Prefetch"]; err != nil {
		return nil, err
	}
	return f.prefetchRes, nil
}

func (f *fakeDaemon) ListSessions(ctx context.Context, req *pegadv1.ListSessionsRequest) (*pegadv1.ListSessionsResponse, error) {
	if err := f.wait(ctx); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	res := proto.Clone(f.sessions).(*pegadv1.ListSessionsResponse)
	if !req.GetIncludeBlocks() {
		for _, s := range res.Sessions {
			s.Locked = nil
		}
	}
	return res, f.errs["ListSessions"]
}

func (f *fakeDaemon) ReleaseLock(ctx context.Context, req *pegadv1.ReleaseLockRequest) (*pegadv1.ReleaseLockResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lastRelease = req
	if req.GetSessionId() != f.sessions.Sessions[0].GetSessionId() {
		return nil, status.Errorf(codes.NotFound, "session not found: %s", req.GetSessionId())
	}
	return &pegadv1.ReleaseLockResponse{ReleasedBlocks: 3}, nil
}

func (f *fakeDaemon) ListConns(ctx context.Context, _ *pegadv1.ListConnsRequest) (*pegadv1.ListConnsResponse, error) {
	return f.conns, f.fail("ListConns")
}

func (f *fakeDaemon) Stats(ctx context.Context, _ *pegadv1.StatsRequest) (*pegadv1.StatsResponse, error) {
	if err := f.wait(ctx); err != nil {
		return nil, err
	}
	if err := f.fail("Stats"); err != nil {
		return nil, err
	}
	return f.stats, nil
}

func (f *fakeDaemon) Version(ctx context.Context, _ *pegadv1.VersionRequest) (*pegadv1.VersionResponse, error) {
	return &pegadv1.VersionResponse{Version: "v0.1.0", Commit: "abc123", GoVersion: "go1.26.8", Transport: "tcp"}, nil
}

// result of one pegactl invocation.
type ran struct {
	stdout string
	stderr string
	code   int
}

// run runs pegactl against f (--socket prepended when f is not nil).
func run(t *testing.T, f *fakeDaemon, args ...string) ran {
	t.Helper()
	if f != nil {
		args = append([]string{"--socket", f.socket}, args...)
	}
	var out, errb bytes.Buffer
	code := Main(context.Background(), args, Streams{In: bytes.NewReader(nil), Out: &out, Err: &errb})
	return ran{stdout: out.String(), stderr: errb.String(), code: code}
}
