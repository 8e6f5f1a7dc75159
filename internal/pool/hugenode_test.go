package pool

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rs/zerolog"
)

// fakeNodeHugeSysfs reports free 2 MiB pages per NUMA node.
func fakeNodeHugeSysfs(t *testing.T, free map[int]string) {
	t.Helper()
	root := t.TempDir()
	for n, f := range free {
		dir := filepath.Join(root, "node"+string(rune('0'+n)), "hugepages", "hugepages-2048kB")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "free_hugepages"), []byte(f+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	old := nodeSysfs
	nodeSysfs = root
	t.Cleanup(func() { nodeSysfs = old })
}

// TestHugePagesPerNode (issue 27 item 7): 2M pages are checked on the
// node each pool part is bound to, not only in the global count, which
// counts pages of the other node too (the old check passed all of these).
func TestHugePagesPerNode(t *testing.T) {
	parts := splitParts(16<<20, 2<<20, []int{0, 1}) // 8 MiB (4 pages) per node
	tests := []struct {
		name    string
		free    map[int]string
		wantErr string
	}{
		{"both nodes have enough", map[int]string{0: "4", 1: "4"}, ""},
		{"all pages on node 0", map[int]string{0: "8", 1: "0"}, "part on NUMA node 1 needs 4 free 2M pages, that node has 0"},
		{"node 0 short", map[int]string{0: "3", 1: "5"}, "part on NUMA node 0 needs 4 free 2M pages, that node has 3"},
		{"no node sysfs: not checked", map[int]string{}, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fakeNodeHugeSysfs(t, tc.free)
			err := checkNodeHugePages(HugePages2M, parts)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if !errors.Is(err, ErrHugePages) || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), "nr_hugepages") {
				t.Fatalf("checkNodeHugePages = %v, want ErrHugePages saying %q and how to reserve", err, tc.wantErr)
			}
		})
	}
	if err := checkNodeHugePages(HugePagesTHP, parts); err != nil {
		t.Fatalf("thp: %v", err)
	}
}

// TestTHPShmemPolicyLogged (issue 27 item 7): thp on the pool's memfd
// depends on shmem_enabled, not on THP for anonymous memory; New says
// which policy it found, and warns when it gives 4 KiB pages.
func TestTHPShmemPolicyLogged(t *testing.T) {
	tests := []struct {
		content, want string
	}{
		{"always within_size advise [never] deny force", "shmem THP is off"},
		{"always within_size [advise] never deny force", `"shmem_enabled":"advise"`},
		{"", "shmem THP policy is unknown"},
	}
	for _, tc := range tests {
		t.Run(tc.want, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "shmem_enabled")
			if tc.content != "" {
				if err := os.WriteFile(path, []byte(tc.content+"\n"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			old := thpShmemPath
			thpShmemPath = path
			t.Cleanup(func() { thpShmemPath = old })
			var buf bytes.Buffer
			p, err := New(Options{Size: 4 << 20, HugePages: HugePagesTHP, Log: zerolog.New(&buf)})
			if err != nil {
				t.Fatal(err)
			}
			p.Close()
			if !strings.Contains(buf.String(), tc.want) {
				t.Fatalf("log %q does not say %q", buf.String(), tc.want)
			}
		})
	}
}
