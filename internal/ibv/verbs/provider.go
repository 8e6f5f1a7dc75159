package verbs

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/pegaflow/pegad/internal/ibv"
)

// DefaultLibrary is the soname loaded at run time.
const DefaultLibrary = "libibverbs.so.1"

// DefaultCQSpin is how long CQ.Wait busy-polls before it blocks on the
// completion channel: short READs complete within it at no syscall; a
// longer wait costs one channel event, not a timer.
const DefaultCQSpin = 20 * time.Microsecond

// Options tune the provider; empty fields take the defaults.
type Options struct {
	// Library is the shared object dlopen'ed (DefaultLibrary). A test
	// build (-tags pegad_fakeverbs) also takes FakeLibrary.
	Library string
	// SysfsRoot is where device attributes are read (DefaultSysfsRoot).
	SysfsRoot string
	// ForceGIDIndex makes every port use GID table entry GIDIndex instead
	// of the chosen one (RoCE v2 preferred, IPv4-mapped first).
	ForceGIDIndex bool
	GIDIndex      int
	// PKeyIndex is the P_Key table entry every QP uses (default 0, the
	// default partition); it must exist on the chosen port.
	PKeyIndex int
	// CQSpin is how long CQ.Wait busy-polls before it blocks on the CQ's
	// completion channel (0: DefaultCQSpin; negative: block at once).
	CQSpin time.Duration
	// NUMANodes names the NUMA node of devices by name, replacing sysfs's
	// numa_node (which virtual devices such as rxe lack): DeviceInfo's
	// NUMANode. Devices not named keep sysfs's (-1 when it has none).
	NUMANodes map[string]int
}

// numaNode is the NUMA node of device name: NUMANodes', else sysfs's.
func (o Options) numaNode(fs sysfs, name string) int {
	if n, ok := o.NUMANodes[name]; ok {
		return n
	}
	return fs.numaNode(name)
}

// cqSpin is the busy-poll budget of CQ.Wait.
func (o Options) cqSpin() time.Duration {
	switch {
	case o.CQSpin == 0:
		return DefaultCQSpin
	case o.CQSpin < 0:
		return 0
	}
	return o.CQSpin
}

// gidIndex is the forced GID index, or -1 to choose.
func (o Options) gidIndex() int {
	if !o.ForceGIDIndex || o.GIDIndex < 0 {
		return -1
	}
	return o.GIDIndex
}

// DefaultOptions are the options New uses.
func DefaultOptions() Options {
	return Options{Library: DefaultLibrary, SysfsRoot: DefaultSysfsRoot}
}

// Provider is the libibverbs provider. Its methods are safe for concurrent
// use; it holds no state besides its options (the library handle is
// process-wide).
type Provider struct {
	opts Options
}

var _ ibv.Provider = (*Provider)(nil)

// New returns a provider with DefaultOptions.
func New() *Provider { return NewWithOptions(DefaultOptions()) }

// NewWithOptions returns a provider with opts.
func NewWithOptions(opts Options) *Provider {
	d := DefaultOptions()
	if opts.Library == "" {
		opts.Library = d.Library
	}
	if opts.SysfsRoot == "" {
		opts.SysfsRoot = d.SysfsRoot
	}
	return &Provider{opts: opts}
}

// Name is "verbs".
func (p *Provider) Name() string { return "verbs" }

// Available says whether the verbs provider can run here, with the one-line
// reason for the daemon's log: the devices found, or why there are none
// ("verbs unavailable: libibverbs.so.1 not found", "verbs unavailable:
// ibv_get_device_list: function not implemented (no RDMA kernel support)").
func Available() (bool, string) {
	devs, err := New().Devices()
	if err != nil {
		if errors.Is(err, ibv.ErrUnavailable) {
			return false, errUnavailableReason(err)
		}
		return false, "verbs unavailable: " + err.Error()
	}
	return true, describeDevices(devs)
}

func describeDevices(devs []ibv.DeviceInfo) string {
	parts := make([]string, 0, len(devs))
	for _, d := range devs {
		addr := fmt.Sprintf("lid %#x", d.LID)
		if d.LinkLayer == "Ethernet" {
			addr = fmt.Sprintf("gid[%d] %s", d.GIDIndex, formatGID(d.GID))
		}
		parts = append(parts, fmt.Sprintf("%s port %d %s %s mtu %d numa %d", d.Name, d.Port, d.LinkLayer, addr, d.MTU, d.NUMANode))
	}
	return fmt.Sprintf("verbs available: %d device(s): %s", len(devs), strings.Join(parts, ", "))
}
