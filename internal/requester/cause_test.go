package requester

import (
	"errors"
	"fmt"
	"strings"
	"syscall"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pegaflow/pegad/internal/conn"
	"github.com/pegaflow/pegad/internal/ibv"
)

// TestFetchErrorOneCause: a failed fetch's text names the peer once,
// carries no gRPC wrapping, and says in words when the peer closed or
// refused the connection.
func TestFetchErrorOneCause(t *testing.T) {
	const peer = "10.0.0.1:50055"
	tests := []struct {
		name     string
		err      error
		want     string
		notWants []string
	}{
		{
			name: "read on a broken connection",
			err:  fmt.Errorf("conn: read from %s: %w: work completion qpn=257: transport retry counter exceeded (12)", peer, conn.ErrConnectionBroken),
			want: "requester: prefetch from 10.0.0.1:50055: read (connection broken): conn: connection broken: work completion qpn=257: transport retry counter exceeded (12)",
		},
		{
			name: "read from a holder that reset the data connection",
			err: fmt.Errorf("conn: read from %s: %w: %w", peer, conn.ErrConnectionBroken, &ibv.StatusError{Status: ibv.WCRetryExcErr, QPN: 257,
				Cause: fmt.Errorf("%w: read tcp 10.0.0.2:40000->10.0.0.1:7471: %w", ibv.ErrPeerClosed, syscall.ECONNRESET)}),
			want: "requester: prefetch from 10.0.0.1:50055: read (connection broken): peer closed the connection (conn: connection broken: work completion qpn=257 wr_id=0: transport retry counter exceeded (12): read tcp 10.0.0.2:40000->10.0.0.1:7471: connection reset by peer)",
		},
		{
			name: "release to a holder that reset the connection",
			err:  status.Error(codes.Unavailable, "error reading from server: read tcp 10.0.0.2:40000->10.0.0.1:50055: read: connection reset by peer"),
			want: "requester: prefetch from 10.0.0.1:50055: read (connection broken): peer closed the connection (error reading from server: read tcp 10.0.0.2:40000->10.0.0.1:50055: read: connection reset by peer)",
		},
		{
			name: "holder gone",
			err:  status.Error(codes.Unavailable, `connection error: desc = "transport: Error while dialing: dial tcp 10.0.0.1:50055: connect: connection refused"`),
			want: "read (connection broken): peer refused the connection (connection refused): is pegad running there?",
		},
		{
			name:     "plaintext holder behind a TLS requester",
			err:      status.Error(codes.Unavailable, `connection error: desc = "transport: authentication handshake failed: tls: first record does not look like a TLS handshake"`),
			want:     "read (connection broken): authentication handshake failed: tls: first record does not look like a TLS handshake",
			notWants: []string{"connection error", "desc =", `"`},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fe := &FetchError{Peer: peer, Phase: PhaseRead, Class: ErrConnection, Err: tc.err}
			got := fe.Error()
			if !strings.Contains(got, tc.want) {
				t.Errorf("got  %q\nwant %q", got, tc.want)
			}
			if strings.Contains(got, "rpc error") || strings.Count(got, peer) > 1+strings.Count(tc.err.Error(), "->"+peer) {
				t.Errorf("wrapping or repeated peer: %q", got)
			}
			for _, nw := range tc.notWants {
				if strings.Contains(got, nw) {
					t.Errorf("%q contains %q", got, nw)
				}
			}
			if !errors.Is(fe, ErrConnection) || !errors.Is(fe, tc.err) {
				t.Error("class or cause lost")
			}
		})
	}
}
