package pool

import (
	"errors"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// setPinEnv replaces the limit and capability queries for one test.
func setPinEnv(t *testing.T, limit uint64, ipcLock bool) {
	t.Helper()
	oldLim, oldCap := memlockLimit, hasIPCLock
	memlockLimit = func() (uint64, error) { return limit, nil }
	hasIPCLock = func() bool { return ipcLock }
	t.Cleanup(func() { memlockLimit, hasIPCLock = oldLim, oldCap })
}

// TestCheckPinLimit: every RDMA registration of the pool is charged to
// RLIMIT_MEMLOCK on its own, so 8 NICs need 8x the pool; a limit big
// enough for one registration (or the mlock) is refused before anything
// is mapped, with the fix named.
func TestCheckPinLimit(t *testing.T) {
	const gib = 1 << 30
	tests := []struct {
		name    string
		limit   uint64
		ipcLock bool
		size    uint64
		nics    int
		wantErr bool
	}{
		{"unlimited", unix.RLIM_INFINITY, false, 64 * gib, 8, false},
		{"enough for all NICs", 512 * gib, false, 64 * gib, 8, false},
		{"enough for one NIC only", 64 * gib, false, 64 * gib, 8, true},
		{"CAP_IPC_LOCK ignores the limit", 64 << 10, true, 64 * gib, 8, false},
		{"tcp registers nothing", 64 << 10, false, 64 * gib, 0, false},
		{"default 8 MiB limit", 8 << 20, false, gib, 1, true},
		{"overflow", 1 << 62, false, 1 << 62, 8, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			setPinEnv(t, tc.limit, tc.ipcLock)
			err := CheckPinLimit(tc.size, tc.nics)
			if !tc.wantErr {
				if err != nil {
					t.Fatalf("CheckPinLimit: %v", err)
				}
				return
			}
			if !errors.Is(err, ErrMemlock) || !strings.Contains(err.Error(), "LimitMEMLOCK=infinity") ||
				!strings.Contains(err.Error(), "CAP_IPC_LOCK") {
				t.Fatalf("CheckPinLimit: %v, want ErrMemlock naming LimitMEMLOCK=infinity and CAP_IPC_LOCK", err)
			}
			t.Log(err)
		})
	}
}

func TestCapEffHas(t *testing.T) {
	status := "Name:\tpegad\nCapInh:\t0000000000000000\nCapPrm:\t0000000000004000\nCapEff:\t0000000000004000\n"
	if !capEffHas(status, capIPCLock) {
		t.Fatal("CapEff 0x4000 has CAP_IPC_LOCK (bit 14)")
	}
	if capEffHas(strings.Replace(status, "CapEff:\t0000000000004000", "CapEff:\t0000000000000000", 1), capIPCLock) {
		t.Fatal("CapEff 0 has no CAP_IPC_LOCK")
	}
	if capEffHas("Name:\tx\n", capIPCLock) {
		t.Fatal("no CapEff line: no capability")
	}
}
