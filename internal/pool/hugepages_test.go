package pool

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rs/zerolog"
)

// fakeHugeSysfs reports free 2 MiB and 1 GiB pages.
func fakeHugeSysfs(t *testing.T, free2M, free1G string) {
	t.Helper()
	root := t.TempDir()
	for dir, free := range map[string]string{"hugepages-2048kB": free2M, "hugepages-1048576kB": free1G} {
		if err := os.MkdirAll(filepath.Join(root, dir), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, dir, "free_hugepages"), []byte(free+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	old := hugeSysfs
	hugeSysfs = root
	t.Cleanup(func() { hugeSysfs = old })
}

// TestHugePagesUnreserved: 2M or 1G pages the operator has not reserved
// fail New before anything is mapped, naming how to reserve them; an
// unknown mode is refused.
func TestHugePagesUnreserved(t *testing.T) {
	fakeHugeSysfs(t, "3", "0")
	tests := []struct {
		mode, want string
	}{
		{HugePages2M, "needs 4 free 2M pages, 3 are"},
		{HugePages1G, "needs 1 free 1G pages, 0 are"},
		{"4K", `mode "4K" is not none, thp, 2M or 1G`},
	}
	for _, tc := range tests {
		t.Run(tc.mode, func(t *testing.T) {
			_, err := New(Options{Size: 8 << 20, HugePages: tc.mode, Log: zerolog.Nop()})
			if !errors.Is(err, ErrHugePages) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New with %s pages: %v, want ErrHugePages saying %q", tc.mode, err, tc.want)
			}
			if tc.mode != "4K" && !strings.Contains(err.Error(), "nr_hugepages") {
				t.Fatalf("error %q does not say how to reserve pages", err)
			}
		})
	}
	if err := checkHugePages(HugePages2M, 6<<20); err != nil {
		t.Fatalf("3 free 2M pages for 6 MiB: %v", err)
	}
}

// TestHugePagesUnsupported: a kernel without 1 GiB pages at all (many
// VMs have no hugepages-1048576kB) fails New with ErrHugePages saying so,
// not with advice to reserve pages that cannot exist.
func TestHugePagesUnsupported(t *testing.T) {
	fakeHugeSysfs(t, "8", "0")
	if err := os.RemoveAll(filepath.Join(hugeSysfs, "hugepages-1048576kB")); err != nil {
		t.Fatal(err)
	}
	_, err := New(Options{Size: 8 << 20, HugePages: HugePages1G, Log: zerolog.Nop()})
	if !errors.Is(err, ErrHugePages) || !strings.Contains(err.Error(), "1G pages not supported here") {
		t.Fatalf("New with 1G pages on a kernel without them: %v, want ErrHugePages saying not supported", err)
	}
}

// TestHugePagesTHP: thp maps and populates like none (the advice is a
// hint), and a 2M pool's size is whole huge pages.
func TestHugePagesTHP(t *testing.T) {
	p, err := New(Options{Size: 4 << 20, HugePages: HugePagesTHP, Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if p.Size() != 4<<20 {
		t.Fatalf("size %d", p.Size())
	}
	if got := hugePageSize(HugePages2M); got != 2<<20 {
		t.Fatalf("2M page size %d", got)
	}
}
