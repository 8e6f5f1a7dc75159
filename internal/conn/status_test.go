package conn

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/pegaflow/pegad/api/pegaderr"
)

// TestAcceptErrorReasons (issue 23): an Accept failure carries a pegaderr
// reason beside its code, so a requester branches on the kind (a draining
// holder is not a link to redial).
func TestAcceptErrorReasons(t *testing.T) {
	tests := []struct {
		name   string
		err    error
		code   codes.Code
		reason pegaderr.Reason
	}{
		{"malformed", fmt.Errorf("%w: nil nic", ErrInvalidHandshake), codes.InvalidArgument, pegaderr.Invalid},
		{"closed", ErrClosed, codes.Unavailable, pegaderr.Draining},
		{"resources", errors.New("no room for QPs"), codes.Aborted, pegaderr.HandshakeAborted},
	}
	if err := withStatus(context.Canceled); err != context.Canceled {
		t.Errorf("a canceled RPC: %v, want its context error unchanged (gRPC gives it its code)", err)
	}
	for _, tc := range tests {
		err := withStatus(tc.err)
		code, reason := pegaderr.FromStatus(err)
		if code != tc.code || reason != tc.reason || !errors.Is(err, tc.err) {
			t.Errorf("%s: %v: code %v reason %q, want %v %q (cause kept)", tc.name, err, code, reason, tc.code, tc.reason)
		}
	}
}
