package client_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/pegaflow/pegad/client"
)

// TestClosedIsBranchable: ErrClosed is the one closed error a caller of
// client/ meets. After Close every data call is errors.Is ErrClosed
// through the wraps a connector adds, and never ErrUnavailable (which
// says "retry"), so a connector shutting down can tell the close it made
// from a daemon gone. The client branches on it too: a lease released
// after Close is no error, since the daemon ended it when the client
// closed.
func TestClosedIsBranchable(t *testing.T) {
	n := startNode(t, nil)
	c := n.dial(t)
	ctx := context.Background()
	if err := c.Put(ctx, "ns", []byte("k"), pattern(4096, 1)); err != nil {
		t.Fatal(err)
	}
	r, err := c.Lease(ctx, "ns", []byte("k"))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := r.Release(); err != nil {
		t.Fatalf("Release after Close: %v, want nil (the daemon ended the lease)", err)
	}
	_, leaseErr := c.Lease(ctx, "ns", []byte("k"))
	_, allocErr := c.Alloc(ctx, "ns", []byte("w"), 4096)
	_, lookupErr := c.Lookup(ctx, "ns", [][]byte{[]byte("k")})
	calls := []struct {
		name string
		err  error
	}{
		{"Put", c.Put(ctx, "ns", []byte("k2"), pattern(4096, 2))},
		{"Lease", leaseErr},
		{"Alloc", allocErr},
		{"Lookup", lookupErr},
	}
	for _, call := range calls {
		wrapped := fmt.Errorf("connector: save: %w", call.err)
		if !errors.Is(wrapped, client.ErrClosed) || errors.Is(wrapped, client.ErrUnavailable) {
			t.Errorf("%s after Close: %v, want ErrClosed (not ErrUnavailable) through a wrap", call.name, call.err)
		}
	}
}
