package daemon_test

import (
	"context"
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/rs/zerolog"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/internal/daemon"
	"github.com/pegaflow/pegad/internal/localdata"
	"github.com/pegaflow/pegad/internal/testutil"
)

// TestPortInUseFailsBeforePool: a peer port in use fails start-up before
// the pool is mapped (it used to come after populating the whole pool).
func TestPortInUseFailsBeforePool(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	cfg := testConfig(t)
	cfg.Listen = busy.Addr().String()
	logs := &testutil.LogBuffer{}
	_, err = daemon.Start(context.Background(), cfg, daemon.WithLogger(zerolog.New(logs)), daemon.WithNotify(func(string) {}))
	if !errorsIsAddrInUse(err) {
		t.Fatalf("err = %v, want address in use", err)
	}
	// The flag is named and the address said once.
	if !strings.HasPrefix(err.Error(), "--listen: ") || strings.Count(err.Error(), cfg.Listen) != 1 {
		t.Fatalf("err = %q", err)
	}
	if strings.Contains(logs.String(), "pool mapped") || strings.Contains(logs.String(), "Populating pool") {
		t.Fatalf("the pool was populated before the port was bound:\n%s", logs)
	}
}

func errorsIsAddrInUse(err error) bool { return errors.Is(err, syscall.EADDRINUSE) }

// TestSocketInUseFailsBeforePool: the same for a socket another pegad
// serves; the failed start leaves the other's socket and the peer port
// it bound free again.
func TestSocketInUseFailsBeforePool(t *testing.T) {
	first := startNode(t, testConfig(t))
	cfg := testConfig(t)
	cfg.Socket = first.d.SocketPath()
	logs := &testutil.LogBuffer{}
	_, err := daemon.Start(context.Background(), cfg, daemon.WithLogger(zerolog.New(logs)), daemon.WithNotify(func(string) {}))
	if err == nil || !strings.Contains(err.Error(), "socket in use") {
		t.Fatalf("err = %v", err)
	}
	if strings.Contains(logs.String(), "pool mapped") {
		t.Fatalf("pool populated before the socket was bound:\n%s", logs)
	}
	// The first pegad's socket survived the failed start.
	if _, err := first.admin.Stats(ctxT(t), &pegadv1.StatsRequest{}); err != nil {
		t.Fatalf("first pegad unreachable after a failed second start: %v", err)
	}
}

// TestRelativeSocket (issue 23): --socket run/a.sock starts (it failed
// the self-check: gRPC read "run" as the target's authority), resolved
// against the working directory, and the data socket lies beside it; a
// path longer than a unix socket allows fails start-up saying so.
func TestRelativeSocket(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	cfg := testConfig(t)
	cfg.Socket = filepath.Join("run", "a.sock")
	n := startNode(t, cfg)
	want := filepath.Join(dir, "run", "a.sock")
	if got := n.d.SocketPath(); got != want {
		t.Fatalf("SocketPath() = %q, want %q", got, want)
	}
	for _, p := range []string{want, localdata.SocketPath(want)} {
		if fi, err := os.Stat(p); err != nil || fi.Mode().Type() != fs.ModeSocket {
			t.Fatalf("%s: %v, want a socket", p, err)
		}
	}
	if _, err := n.admin.Stats(ctxT(t), &pegadv1.StatsRequest{}); err != nil {
		t.Fatalf("stats over the resolved socket: %v", err)
	}

	long := testConfig(t)
	long.Socket = strings.Repeat("d", 120) + ".sock"
	_, err := daemon.Start(context.Background(), long, daemon.WithLogger(zerolog.Nop()), daemon.WithNotify(func(string) {}))
	if err == nil || !strings.Contains(err.Error(), "longer than the 107 a unix socket path may have") {
		t.Fatalf("start with a %d-byte socket path: %v", len(long.Socket), err)
	}
}

// TestReadyLineNamesTransport: "pegad ready" names the transport, its NICs
// and the data ports; the pool's population is logged before and after.
func TestReadyLineNamesTransport(t *testing.T) {
	cfg := testConfig(t)
	cfg.NICs = "2"
	n := startNode(t, cfg)
	var ready string
	for _, l := range strings.Split(n.logs.String(), "\n") {
		if strings.Contains(l, `"message":"pegad ready"`) {
			ready = l
		}
	}
	for _, want := range []string{`"transport":"tcp"`, `"nics":["tcp0","tcp1"]`, `"data_addrs":["127.0.0.1:`} {
		if !strings.Contains(ready, want) {
			t.Errorf("ready line lacks %s: %s", want, ready)
		}
	}
	for _, want := range []string{`"message":"Populating pool"`, `"message":"Pool ready"`} {
		if !strings.Contains(n.logs.String(), want) {
			t.Errorf("no %s in the start-up log", want)
		}
	}
}
