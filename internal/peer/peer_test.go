package peer

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// echoServer answers RenewTransferLock with a fixed expiry and counts calls.
type echoServer struct {
	pegadv1.UnimplementedPeerServiceServer
	mu    sync.Mutex // guards calls
	calls int
}

func (s *echoServer) RenewTransferLock(_ context.Context, req *pegadv1.RenewTransferLockRequest) (*pegadv1.RenewTransferLockResponse, error) {
	s.mu.Lock()
	s.calls++
	s.mu.Unlock()
	if req.GetSessionId() == "" {
		return nil, errors.New("empty session")
	}
	return &pegadv1.RenewTransferLockResponse{ExpiresAt: timestamppb.New(time.Unix(42, 0))}, nil
}

func startServer(t *testing.T) (string, *echoServer) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	es := &echoServer{}
	pegadv1.RegisterPeerServiceServer(srv, es)
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(lis) }()
	t.Cleanup(func() { srv.Stop(); <-done })
	return lis.Addr().String(), es
}

func TestClientsRoundTripAndCache(t *testing.T) {
	addr1, s1 := startServer(t)
	addr2, s2 := startServer(t)
	c := NewClients()
	t.Cleanup(func() { _ = c.Close() })

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	// Many concurrent Gets of two peers: exactly two cached connections, and
	// each client reaches its own server.
	var wg sync.WaitGroup
	for i := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			addr := addr1
			if i%2 == 1 {
				addr = addr2
			}
			cl, err := c.Get(addr)
			if err != nil {
				t.Error(err)
				return
			}
			resp, err := cl.RenewTransferLock(ctx, &pegadv1.RenewTransferLockRequest{SessionId: "s"})
			if err != nil {
				t.Error(err)
				return
			}
			if got := resp.GetExpiresAt().AsTime().Unix(); got != 42 {
				t.Errorf("expires_at = %d, want 42", got)
			}
		}()
	}
	wg.Wait()
	if n := c.Len(); n != 2 {
		t.Fatalf("cached connections = %d, want 2", n)
	}
	s1.mu.Lock()
	n1 := s1.calls
	s1.mu.Unlock()
	s2.mu.Lock()
	n2 := s2.calls
	s2.mu.Unlock()
	if n1 != 16 || n2 != 16 {
		t.Fatalf("server calls = %d, %d; want 16, 16", n1, n2)
	}
}

func TestClientsErrors(t *testing.T) {
	c := NewClients()
	if _, err := c.Get(""); err == nil {
		t.Fatal("Get(\"\") succeeded")
	}
	if _, err := c.Get("127.0.0.1:1"); err != nil {
		t.Fatalf("Get is lazy and must not fail for an unreachable peer: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := c.Get("127.0.0.1:1"); !errors.Is(err, errClosed) {
		t.Fatalf("Get after Close = %v, want errClosed", err)
	}
}

// TestReconnectSkipsBackoff (review finding): after a failed dial the
// channel sits in reconnect backoff (about 1 s first) and fails every RPC
// at once with the old dial error, even once the peer is back. Reconnect
// makes it connect now and returns when it is ready.
func TestReconnectSkipsBackoff(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close() // the peer is down
	c := NewClients()
	t.Cleanup(func() { _ = c.Close() })
	cl, err := c.Get(addr)
	if err != nil {
		t.Fatal(err)
	}
	renew := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := cl.RenewTransferLock(ctx, &pegadv1.RenewTransferLockRequest{SessionId: "s"})
		return err
	}
	if err := renew(); status.Code(err) != codes.Unavailable {
		t.Fatalf("RPC to a down peer: %v, want Unavailable", err)
	}

	// The peer comes back on the same address.
	lis, err = net.Listen("tcp", addr)
	if err != nil {
		t.Skipf("address %s taken meanwhile: %v", addr, err)
	}
	srv := grpc.NewServer()
	pegadv1.RegisterPeerServiceServer(srv, &echoServer{})
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(lis) }()
	t.Cleanup(func() { srv.Stop(); <-done })
	if err := renew(); status.Code(err) != codes.Unavailable {
		t.Fatalf("RPC right after the peer came back: %v, want Unavailable (channel in backoff)", err)
	}

	rc, ok := cl.(Reconnecter)
	if !ok {
		t.Fatalf("client %T is not a Reconnecter", cl)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 600*time.Millisecond)
	defer cancel()
	if err := rc.Reconnect(ctx); err != nil {
		t.Fatalf("Reconnect: %v (the channel waited out its backoff)", err)
	}
	if err := renew(); err != nil {
		t.Fatalf("RPC after Reconnect: %v", err)
	}

	// A peer that stays down: Reconnect gives up when ctx ends.
	srv.Stop()
	<-done
	_ = renew()
	// The channel notices the closed transport asynchronously: until it
	// has left READY, Reconnect rightly has nothing to do.
	cc := cl.(client).cc
	wctx, wcancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer wcancel()
	for cc.GetState() == connectivity.Ready {
		if !cc.WaitForStateChange(wctx, connectivity.Ready) {
			t.Fatal("channel still READY 5 s after the peer stopped")
		}
	}
	ctx2, cancel2 := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel2()
	if err := rc.Reconnect(ctx2); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Reconnect to a down peer: %v, want DeadlineExceeded", err)
	}
}
