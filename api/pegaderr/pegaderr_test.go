package pegaderr

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

var (
	errGone  = errors.New("gone")
	errOther = errors.New("other")
)

// TestRoundTrip: what ToStatus encodes, FromStatus decodes: the code and
// reason of the first row the error matches, the error's own text;
// context errors keep their codes; a status passes unchanged; anything
// else is Internal.
func TestRoundTrip(t *testing.T) {
	kinds := []Kind{
		{Err: errGone, Code: codes.NotFound, Reason: UnknownSession},
		{Err: errOther, Code: codes.FailedPrecondition, Reason: StaleIncarnation},
	}
	tests := []struct {
		name   string
		err    error
		code   codes.Code
		reason Reason
		msg    string
	}{
		{"wrapped sentinel", fmt.Errorf("session x: %w", errGone), codes.NotFound, UnknownSession, "session x: gone"},
		{"first row wins", fmt.Errorf("%w, %w", errOther, errGone), codes.NotFound, UnknownSession, "other, gone"},
		{"deadline", fmt.Errorf("read: %w", context.DeadlineExceeded), codes.DeadlineExceeded, Deadline, "read: context deadline exceeded"},
		{"canceled", context.Canceled, codes.Canceled, Canceled, "context canceled"},
		{"a status passes", status.Error(codes.Unavailable, "down"), codes.Unavailable, "", "down"},
		{"unknown error", errors.New("boom"), codes.Internal, Internal, "boom"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out := ToStatus(tc.err, kinds)
			code, reason := FromStatus(out)
			if code != tc.code || reason != tc.reason || status.Convert(out).Message() != tc.msg {
				t.Fatalf("ToStatus(%v) = %v (reason %q), want %v %q %q", tc.err, out, reason, tc.code, tc.reason, tc.msg)
			}
		})
	}
	if ToStatus(nil, kinds) != nil {
		t.Fatal("ToStatus(nil) is not nil")
	}
	if c, r := FromStatus(nil); c != codes.OK || r != "" {
		t.Fatalf("FromStatus(nil) = %v %q", c, r)
	}
	if c, r := FromStatus(errors.New("plain")); c != codes.Unknown || r != "" {
		t.Fatalf("FromStatus(plain) = %v %q", c, r)
	}
	// A reason survives wrapping on the client side (fmt.Errorf %w).
	if _, r := FromStatus(fmt.Errorf("call: %w", Status(codes.Unavailable, Draining, "draining").Err())); r != Draining {
		t.Fatalf("wrapped status lost its reason: %q", r)
	}
}
