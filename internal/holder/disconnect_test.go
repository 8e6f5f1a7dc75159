package holder

import (
	"context"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/internal/metrics"
)

// fakeDisconnector is an Acceptor that can also disconnect.
type fakeDisconnector struct {
	fakeAcceptor
	mu    sync.Mutex // guards calls
	calls []*pegadv1.RdmaDisconnectRequest
	err   error
}

func (d *fakeDisconnector) Disconnect(_ context.Context, r *pegadv1.RdmaDisconnectRequest) (*pegadv1.RdmaDisconnectResponse, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.calls = append(d.calls, r)
	if d.err != nil {
		return nil, d.err
	}
	return &pegadv1.RdmaDisconnectResponse{QpsReleased: 4}, nil
}

func TestRdmaDisconnect(t *testing.T) {
	good := &pegadv1.RdmaDisconnectRequest{Requester: req("A", "a-1"), HandshakeId: "0123456789abcdef"}
	for _, tc := range []struct {
		name     string
		acceptor Acceptor
		req      *pegadv1.RdmaDisconnectRequest
		code     codes.Code
		released uint32
		calls    int
	}{
		{"delegated", &fakeDisconnector{}, good, codes.OK, 4, 1},
		{"acceptor error keeps its code", &fakeDisconnector{err: status.Error(codes.InvalidArgument, "bad")}, good, codes.InvalidArgument, 0, 1},
		{"no node id", &fakeDisconnector{}, &pegadv1.RdmaDisconnectRequest{HandshakeId: "x"}, codes.InvalidArgument, 0, 0},
		{"long node id", &fakeDisconnector{}, &pegadv1.RdmaDisconnectRequest{Requester: req(strings.Repeat("n", MaxNodeIDLen+1), ""), HandshakeId: "x"}, codes.InvalidArgument, 0, 0},
		{"no handshake id", &fakeDisconnector{}, &pegadv1.RdmaDisconnectRequest{Requester: req("A", "a-1")}, codes.InvalidArgument, 0, 0},
		{"no acceptor", nil, good, codes.Unavailable, 0, 0},
		{"acceptor cannot disconnect", &fakeAcceptor{}, good, codes.Unimplemented, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, func(o *Options) { o.Acceptor = tc.acceptor })
			sid := e.open(t, "A", "a-1", 2)
			before := e.state()
			resp, err := e.client(t).RdmaDisconnect(ctxT(t), tc.req)
			if got := status.Code(err); got != tc.code {
				t.Fatalf("code = %v (%v), want %v", got, err, tc.code)
			}
			if resp.GetQpsReleased() != tc.released {
				t.Fatalf("qps_released = %d, want %d", resp.GetQpsReleased(), tc.released)
			}
			if d, ok := tc.acceptor.(*fakeDisconnector); ok && len(d.calls) != tc.calls {
				t.Fatalf("Disconnect called %d times, want %d", len(d.calls), tc.calls)
			}
			if got := e.rpcCount(metrics.RPCDisconnect, tc.code.String()); got != 1 {
				t.Fatalf("holder_rpc_total{rdma_disconnect,%v} = %v, want 1", tc.code, got)
			}
			// A disconnect frees connections only: transfer locks stay.
			if after := e.state(); after != before {
				t.Fatalf("lock state changed: %+v -> %+v", before, after)
			}
			if _, _, err := e.svc.locks.Renew(sid, "A", "a-1"); err != nil {
				t.Fatalf("session after disconnect: %v", err)
			}
		})
	}
}
