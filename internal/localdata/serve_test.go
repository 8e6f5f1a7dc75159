package localdata

import (
	"errors"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/pegaflow/pegad/internal/pool"
	"github.com/pegaflow/pegad/internal/store"
	pegadtest "github.com/pegaflow/pegad/internal/testutil"
)

// TestServeAfterClose: a Serve that starts after Close (a daemon stopped
// before its serving goroutine ran) returns nil, the clean stop it is,
// and closes its listener; it used to return an error of its own, which
// the daemon logged as "Server stopped with an error".
func TestServeAfterClose(t *testing.T) {
	p, err := pool.New(pool.Options{Size: 1 << 20, Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	srv := New(Options{Store: store.New(p, nil), LeaseTimeout: time.Minute, Metrics: prometheus.NewRegistry(), Log: zerolog.Nop()})
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", filepath.Join(pegadtest.ShortTempDir(t), "d.sock"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	if err := srv.Serve(l); err != nil {
		t.Fatalf("Serve after Close = %v, want nil", err)
	}
	if _, err := l.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Accept on the listener Serve was given: %v, want net.ErrClosed", err)
	}
}
