package requester

import (
	"errors"
	"fmt"
	"testing"

	"github.com/pegaflow/pegad/internal/conn"
	"github.com/pegaflow/pegad/internal/ibv"
)

// TestInnocentOnlyForBystanders: a read is retried on a fresh connection
// only when it failed as a bystander (flushed, never run, connection
// invalidated by another caller), never when its own WR failed: over a
// cut link that retry waited out the lock deadline and turned a connection
// error into a deadline one (scripts/e2e-netns.sh phase c exited 1, want 4).
func TestInnocentOnlyForBystanders(t *testing.T) {
	wc := func(s ibv.WCStatus) error {
		return fmt.Errorf("%w: %w", conn.ErrConnectionBroken, &ibv.StatusError{Status: s, QPN: 0x101})
	}
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"session invalidated before batch", fmt.Errorf("qp 0x101: %w", conn.ErrSessionInvalidated), true},
		{"connection invalidated by another read", fmt.Errorf("%w: peer invalidated: canceled", conn.ErrConnectionBroken), true},
		{"own WR flushed", wc(ibv.WCWRFlushErr), true},
		{"own WR retry exceeded (link cut)", wc(ibv.WCRetryExcErr), false},
		{"own WR remote access error", wc(ibv.WCRemAccessErr), false},
		{"deadline", errors.New("context deadline exceeded"), false},
		{"invalid op", conn.ErrInvalidOp, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := innocent(tc.err); got != tc.want {
				t.Fatalf("innocent(%v) = %v, want %v", tc.err, got, tc.want)
			}
		})
	}
}
