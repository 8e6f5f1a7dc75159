package ctl

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/pegaflow/pegad/internal/config"
	"github.com/pegaflow/pegad/internal/testutil/cluster"
)

// TestBlocksPutGetZeroCopy: against a real pegad, blocks put and get go
// through the data socket (the public client's zero-copy path) and keep
// their output and exit codes.
func TestBlocksPutGetZeroCopy(t *testing.T) {
	d := cluster.Start(t, cluster.Named("ctl-test"), cluster.WithConfig(func(c *config.Config) { c.MetricsListen = "" }))
	if _, err := os.Stat(d.SocketPath() + ".data"); err != nil {
		t.Fatalf("no data socket: %v", err)
	}
	dir := t.TempDir()
	k, kb := writeRandom(t, dir, "k", 3<<20, 1)
	v, vb := writeRandom(t, dir, "v", 1<<20, 2)
	sock := []string{"--socket", d.SocketPath()}

	r := run(t, nil, append(sock, "-o", "json", "blocks", "put", "--namespace", "ns", "--hash", "ab01", "--kv", "--file", k, "--file", v)...)
	var put putResult
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &put) != nil || !put.Created || put.Bytes != 4<<20 {
		t.Fatalf("put: code %d stdout %q stderr %q", r.code, r.stdout, r.stderr)
	}
	r = run(t, nil, append(sock, "-o", "json", "blocks", "put", "--namespace", "ns", "--hash", "ab01", "--kv", "--file", k, "--file", v)...)
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &put) != nil || put.Created {
		t.Fatalf("second put: code %d stdout %q stderr %q", r.code, r.stdout, r.stderr)
	}
	out := filepath.Join(dir, "out")
	r = run(t, nil, append(sock, "-o", "json", "blocks", "get", "--namespace", "ns", "--hash", "ab01", "--out", out)...)
	var get getResult
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &get) != nil || get.Bytes != 4<<20 ||
		len(get.Slots) != 1 || get.Slots[0].KSize != 3<<20 || get.Slots[0].VSize != 1<<20 {
		t.Fatalf("get: code %d stdout %q stderr %q", r.code, r.stdout, r.stderr)
	}
	got, err := os.ReadFile(out)
	if err != nil || !bytes.Equal(got, append(kb, vb...)) {
		t.Fatalf("get wrote %d bytes (%v), not the K then V put", len(got), err)
	}
	r = run(t, nil, append(sock, "blocks", "get", "--namespace", "ns", "--hash", "ff", "--out", out)...)
	// The data socket's answer reads as GetBlock's does (docs/pegactl.md).
	if want := "Error: block not found: namespace=ns hash=ff\n"; r.code != ExitNotFound || r.stderr != want {
		t.Fatalf("get of a missing block: code %d stderr %q, want %d and %q", r.code, r.stderr, ExitNotFound, want)
	}
	r = run(t, nil, append(sock, "blocks", "put", "--namespace", "ns", "--hash", string(bytes.Repeat([]byte("ab"), 65)), "--file", k)...)
	if r.code != ExitUsage {
		t.Fatalf("put with a 65-byte hash: code %d stderr %q, want %d", r.code, r.stderr, ExitUsage)
	}
}
