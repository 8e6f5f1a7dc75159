package client

import (
	"errors"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pegaflow/pegad/api/pegaderr"
)

// TestFromStatusByReason: the daemon's pegaderr reason picks the typed
// error where a code alone cannot (ResourceExhausted is a full pool or a
// limit); a status without a reason (an older daemon) maps by its code;
// both keep the gRPC status.
func TestFromStatusByReason(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want error
	}{
		{"limit", pegaderr.Status(codes.ResourceExhausted, pegaderr.Limit, "peer limit").Err(), ErrLimit},
		{"no space", pegaderr.Status(codes.ResourceExhausted, pegaderr.NoSpace, "pool full").Err(), ErrPoolFull},
		{"draining", pegaderr.Status(codes.Unavailable, pegaderr.Draining, "draining").Err(), ErrUnavailable},
		{"ended session", pegaderr.Status(codes.NotFound, pegaderr.SessionEnded, "ended").Err(), ErrNotFound},
		{"unknown peer", pegaderr.Status(codes.PermissionDenied, pegaderr.UnknownPeer, "peer x").Err(), ErrDenied},
		{"code only", status.Error(codes.ResourceExhausted, "full"), ErrPoolFull},
		{"reason unknown to this client", pegaderr.Status(codes.NotFound, "SOMETHING_NEW", "x").Err(), ErrNotFound},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := fromStatus(tc.err)
			if !errors.Is(got, tc.want) || status.Code(got) != status.Code(tc.err) {
				t.Fatalf("fromStatus(%v) = %v (code %v), want %v keeping code %v", tc.err, got, status.Code(got), tc.want, status.Code(tc.err))
			}
		})
	}
}
