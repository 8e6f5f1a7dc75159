package pool

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// ErrMemlock: RLIMIT_MEMLOCK is too small for the memory RDMA registration
// will pin, and the process lacks CAP_IPC_LOCK.
var ErrMemlock = errors.New("pool: RLIMIT_MEMLOCK too small for RDMA registration")

// capIPCLock is CAP_IPC_LOCK's bit in /proc/self/status CapEff.
const capIPCLock = 14

// Hooks for tests: the limit and capability queries.
var (
	memlockLimit = func() (uint64, error) {
		var lim unix.Rlimit
		if err := unix.Getrlimit(unix.RLIMIT_MEMLOCK, &lim); err != nil {
			return 0, err
		}
		return lim.Cur, nil
	}
	hasIPCLock = func() bool {
		b, err := os.ReadFile("/proc/self/status")
		if err != nil {
			return false
		}
		return capEffHas(string(b), capIPCLock)
	}
)

// capEffHas reports whether the CapEff line of a /proc/<pid>/status text
// has capability bit set.
func capEffHas(status string, bit uint) bool {
	for line := range strings.Lines(status) {
		v, ok := strings.CutPrefix(line, "CapEff:")
		if !ok {
			continue
		}
		caps, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
		return err == nil && caps&(1<<bit) != 0
	}
	return false
}

// CheckPinLimit checks, before anything is mapped, that registering a pool
// of size bytes with nics RDMA devices can pin it: the kernel charges every
// registration to RLIMIT_MEMLOCK separately (ib_umem_get adds its pages to
// pinned_vm), so nics registrations of one pool need nics x size, unless
// the process has CAP_IPC_LOCK. The error wraps ErrMemlock and names the
// fix.
func CheckPinLimit(size uint64, nics int) error {
	if nics <= 0 || size == 0 {
		return nil
	}
	lim, err := memlockLimit()
	if err != nil || lim == unix.RLIM_INFINITY || hasIPCLock() {
		return nil // unknown limits are left to the registration's own error
	}
	need := size * uint64(nics)
	if need/uint64(nics) != size { // overflow: no finite limit covers it
		need = ^uint64(0)
	}
	if lim >= need {
		return nil
	}
	return fmt.Errorf("%w: registering the %s pool on %d NICs pins %s, RLIMIT_MEMLOCK is %s: "+
		"set LimitMEMLOCK=infinity in the systemd unit (or `ulimit -l unlimited`), or grant CAP_IPC_LOCK",
		ErrMemlock, humanBytes(size), nics, humanBytes(need), humanBytes(lim))
}

// humanBytes renders n in the largest binary unit that keeps it whole
// enough to read ("64 GiB", "8 MiB", "512 B").
func humanBytes(n uint64) string {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"}
	i := 0
	v := float64(n)
	for v >= 1024 && i < len(units)-1 {
		v /= 1024
		i++
	}
	if v == float64(uint64(v)) {
		return fmt.Sprintf("%d %s", uint64(v), units[i])
	}
	return fmt.Sprintf("%.1f %s", v, units[i])
}
