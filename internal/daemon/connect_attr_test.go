package daemon_test

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/pegaflow/pegad/internal/daemon"
	"github.com/pegaflow/pegad/internal/pool"
)

// TestStartExtendsTimeout: while Start runs, systemd is asked for more
// time (EXTEND_TIMEOUT_USEC), and never after READY=1.
func TestStartExtendsTimeout(t *testing.T) {
	daemon.SetExtendEvery(t, time.Millisecond)
	n := startNode(t, testConfig(t))
	notes := slices.Clone(*n.notes) // Start has returned: no sender left
	ready := slices.Index(notes, "READY=1")
	if ready < 1 || !strings.HasPrefix(notes[0], "EXTEND_TIMEOUT_USEC=") {
		t.Fatalf("sd_notify during start %v: want EXTEND_TIMEOUT_USEC=... before READY=1", notes)
	}
	for _, s := range notes[ready:] {
		if strings.HasPrefix(s, "EXTEND_TIMEOUT_USEC=") {
			t.Fatalf("sd_notify %v: EXTEND_TIMEOUT_USEC after READY=1", notes)
		}
	}
	if want := "EXTEND_TIMEOUT_USEC=30000000"; notes[0] != want {
		t.Fatalf("first note %q, want %q", notes[0], want)
	}
}

// TestStartHugePagesUnreserved: --pool-hugepages=1G where none are free
// stops the start with the pool's clear error. What that error says
// depends on the host: a kernel that knows 1 GiB pages but has none
// reserved is told how to reserve them (nr_hugepages); one without them
// at all (many VMs: no hugepages-1048576kB) says they are not supported.
func TestStartHugePagesUnreserved(t *testing.T) {
	const dir = "/sys/kernel/mm/hugepages/hugepages-1048576kB"
	want := "nr_hugepages"
	switch b, err := os.ReadFile(dir + "/free_hugepages"); {
	case errors.Is(err, fs.ErrNotExist):
		want = "1G pages not supported here"
	case err != nil:
		t.Skipf("cannot read this host's 1 GiB page count: %v", err)
	case strings.TrimSpace(string(b)) != "0":
		t.Skip("this host has free 1 GiB pages")
	}
	cfg := testConfig(t)
	cfg.PoolHugePages = "1G"
	d, err := daemon.Start(context.Background(), cfg, daemon.WithLogger(zerolog.Nop()))
	if err == nil {
		d.Close()
		t.Fatal("start with unreserved 1G pages succeeded")
	}
	if !errors.Is(err, pool.ErrHugePages) || !strings.Contains(err.Error(), want) {
		t.Fatalf("start: %v, want pool.ErrHugePages saying %q", err, want)
	}
}
