//go:build linux && cgo && !noverbs

package verbs

/*
// The verbs declarations come from include/ (rdma-core 44.0, carried in the
// repo), never from the system, so the build needs no libibverbs-dev.
#cgo CFLAGS: -O2 -Wall -I${SRCDIR}/include
#cgo LDFLAGS: -ldl
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"strings"
	"sync"
	"syscall"
	"unsafe"

	"github.com/pegaflow/pegad/internal/ibv"
)

// lib is one loaded libibverbs; its C table lives for the process.
type lib struct {
	c    *C.pv_lib
	name string
}

// libs caches dlopen results by library name, failures included: the
// answer does not change while the process runs, and dlopen is not free.
var libs struct {
	mu sync.Mutex // guards m
	m  map[string]libResult
}

type libResult struct {
	l   *lib
	err error
}

// loadLib dlopens name once per process and resolves the entry points.
func loadLib(name string) (*lib, error) {
	libs.mu.Lock()
	defer libs.mu.Unlock()
	if r, ok := libs.m[name]; ok {
		return r.l, r.err
	}
	l, err := openLib(name)
	if libs.m == nil {
		libs.m = make(map[string]libResult)
	}
	libs.m[name] = libResult{l: l, err: err}
	return l, err
}

func openLib(name string) (*lib, error) {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	var buf [512]C.char
	var c *C.pv_lib
	switch rc := C.pv_open(cname, &c, &buf[0], C.size_t(len(buf))); rc {
	case 0:
		return &lib{c: c, name: name}, nil
	case 1:
		return nil, unavailable(dlopenReason(name, C.GoString(&buf[0])), nil)
	default:
		return nil, unavailable(fmt.Sprintf("%s lacks %s (rdma-core too old?)", name, C.GoString(&buf[0])), nil)
	}
}

// dlopenReason shortens dlerror's text for the common case.
func dlopenReason(name, dlerr string) string {
	if strings.Contains(dlerr, "No such file or directory") || strings.Contains(dlerr, "cannot open shared object file") {
		return name + " not found (install rdma-core's libibverbs1 to use RDMA)"
	}
	return "dlopen " + name + ": " + dlerr
}

// deviceList returns the names of the RDMA devices, or ErrUnavailable with
// the reason when there are none.
func (l *lib) deviceNames() ([]string, error) {
	var n, errno C.int
	list := C.pv_get_device_list(l.c, &n, &errno)
	if list == nil {
		e := verbsErr("ibv_get_device_list", syscall.Errno(errno))
		return nil, unavailable(e.Error(), e)
	}
	defer C.pv_free_device_list(l.c, list)
	devs := unsafe.Slice(list, int(n))
	names := make([]string, 0, len(devs))
	for _, d := range devs {
		names = append(names, C.GoString(C.pv_get_device_name(l.c, d)))
	}
	if len(names) == 0 {
		return nil, unavailable("no RDMA devices found", nil)
	}
	return names, nil
}

// openContext opens device name, or ErrNoDevice.
func (l *lib) openContext(name string) (*C.struct_ibv_context, error) {
	var n, errno C.int
	list := C.pv_get_device_list(l.c, &n, &errno)
	if list == nil {
		e := verbsErr("ibv_get_device_list", syscall.Errno(errno))
		return nil, unavailable(e.Error(), e)
	}
	defer C.pv_free_device_list(l.c, list)
	var have []string
	for _, d := range unsafe.Slice(list, int(n)) {
		dn := C.GoString(C.pv_get_device_name(l.c, d))
		if dn != name {
			have = append(have, dn)
			continue
		}
		ctx := C.pv_open_device(l.c, d, &errno)
		if ctx == nil {
			return nil, fmt.Errorf("open %s: %w", name, verbsErr("ibv_open_device", syscall.Errno(errno)))
		}
		return ctx, nil
	}
	return nil, fmt.Errorf("device %q (have %v): %w", name, have, ibv.ErrNoDevice)
}

// devLimits are the device attributes the provider enforces.
type devLimits struct {
	maxQPWR, maxSGE, maxCQE  int
	maxRdAtom, maxInitRdAtom int
	ports                    int
	maxMRSize                uint64 // 0: unknown
}

func (l *lib) queryDevice(ctx *C.struct_ibv_context) (devLimits, error) {
	var a C.pv_devattr
	if rc := C.pv_query_device(l.c, ctx, &a); rc != 0 {
		return devLimits{}, verbsErr("ibv_query_device", syscall.Errno(rc))
	}
	return devLimits{
		maxQPWR: int(a.max_qp_wr), maxSGE: int(a.max_sge), maxCQE: int(a.max_cqe),
		maxRdAtom: int(a.max_qp_rd_atom), maxInitRdAtom: int(a.max_qp_init_rd_atom),
		ports: int(a.phys_port_cnt), maxMRSize: uint64(a.max_mr_size),
	}, nil
}

// queryPorts describes every port; GIDs are read only for ACTIVE ports (the
// only candidates), from libibverbs, falling back to sysfs.
func (l *lib) queryPorts(ctx *C.struct_ibv_context, dev string, nports int, fs sysfs, gidIndex int) ([]portDesc, error) {
	ports := make([]portDesc, 0, nports)
	for p := 1; p <= nports; p++ {
		var a C.pv_portattr
		if rc := C.pv_query_port(l.c, ctx, C.uint8_t(p), &a); rc != 0 {
			return nil, fmt.Errorf("port %d: %w", p, verbsErr("ibv_query_port", syscall.Errno(rc)))
		}
		d := portDesc{Num: uint8(p), State: int(a.state), LinkLayer: int(a.link_layer), LID: uint16(a.lid), ActiveMTU: int(a.active_mtu), Flags: int(a.flags), PKeys: int(a.pkey_tbl_len)}
		if d.State == portActive {
			d.GIDs = l.queryGIDs(ctx, dev, d, int(a.gid_tbl_len), fs, gidIndex)
		}
		ports = append(ports, d)
	}
	return ports, nil
}

func (l *lib) queryGIDs(ctx *C.struct_ibv_context, dev string, p portDesc, tbl int, fs sysfs, gidIndex int) []gidEntry {
	eth := p.LinkLayer == linkLayerEthernet
	n := tbl
	if !eth {
		// InfiniBand uses the port GID (index 0) unless told otherwise.
		n = max(1, gidIndex+1)
	}
	var out []gidEntry
	for i := 0; i < n && i < tbl; i++ {
		var raw [16]C.uint8_t
		var typ C.int
		if C.pv_query_gid(l.c, ctx, C.uint8_t(p.Num), C.int(i), &raw[0], &typ) != 0 {
			continue // empty entry (ENODATA) or unreadable
		}
		var g ibv.GID
		for j := range g {
			g[j] = byte(raw[j])
		}
		if g == (ibv.GID{}) {
			continue
		}
		t := gidType(typ)
		switch {
		case typ < 0:
			t = fs.gidType(dev, p.Num, i, eth)
		case eth && t == gidTypeIB:
			t = gidTypeRoCEv1 // the kernel's "IB/RoCE v1" on Ethernet
		}
		out = append(out, gidEntry{Index: i, GID: g, Type: t})
	}
	if len(out) == 0 {
		// The library could not read the table; the kernel's sysfs view
		// is the same table.
		if s, err := fs.gids(dev, p.Num, eth); err == nil {
			out = s
		}
	}
	return out
}

// describe opens nothing: it queries an open context and chooses the port.
func (l *lib) describe(ctx *C.struct_ibv_context, name string, want uint8, o Options) (ibv.DeviceInfo, devLimits, portChoice, error) {
	lim, err := l.queryDevice(ctx)
	if err != nil {
		return ibv.DeviceInfo{}, lim, portChoice{}, err
	}
	fs := sysfs{root: o.SysfsRoot}
	ports, err := l.queryPorts(ctx, name, lim.ports, fs, o.gidIndex())
	if err != nil {
		return ibv.DeviceInfo{}, lim, portChoice{}, err
	}
	c, err := choosePort(ports, want, o.gidIndex())
	if err != nil {
		return ibv.DeviceInfo{}, lim, portChoice{}, err
	}
	if o.PKeyIndex < 0 || o.PKeyIndex > 0xffff || (c.PKeys > 0 && o.PKeyIndex >= c.PKeys) {
		return ibv.DeviceInfo{}, lim, portChoice{}, fmt.Errorf("P_Key index %d outside port %d's table of %d entries: %w",
			o.PKeyIndex, c.Port, c.PKeys, ibv.ErrInvalidArgument)
	}
	info := deviceInfo(name, o.numaNode(fs, name), c, lim.maxQPWR, min(lim.maxInitRdAtom, lim.maxRdAtom))
	info.MemWindows = l.memWindows(ctx)
	return info, lim, c, nil
}

func (p *Provider) load() (*lib, error) {
	if l := fakeLib(p.opts.Library); l != nil {
		return l, nil // tests only: fake_cgo.go (-tags pegad_fakeverbs)
	}
	return loadLib(p.opts.Library)
}

// Devices lists the devices with a usable port. ErrUnavailable, with the
// reason, when libibverbs is missing, the kernel has no RDMA support, there
// are no devices, or no device has a usable port.
func (p *Provider) Devices() ([]ibv.DeviceInfo, error) {
	l, err := p.load()
	if err != nil {
		return nil, err
	}
	names, err := l.deviceNames()
	if err != nil {
		return nil, err
	}
	var out []ibv.DeviceInfo
	var why []string
	for _, n := range names {
		info, err := p.probe(l, n)
		if err != nil {
			why = append(why, fmt.Sprintf("%s: %v", n, err))
			continue
		}
		out = append(out, info)
	}
	if len(out) == 0 {
		return nil, unavailable("no usable RDMA device: "+strings.Join(why, "; "), nil)
	}
	return out, nil
}

func (p *Provider) probe(l *lib, name string) (ibv.DeviceInfo, error) {
	ctx, err := l.openContext(name)
	if err != nil {
		return ibv.DeviceInfo{}, err
	}
	defer C.pv_close_device(l.c, ctx)
	info, _, _, err := l.describe(ctx, name, 0, p.opts)
	return info, err
}

// Open opens "dev" (its first usable port) or "dev:port".
func (p *Provider) Open(name string) (ibv.Device, error) {
	devName, port, err := parseDeviceName(name)
	if err != nil {
		return nil, err
	}
	l, err := p.load()
	if err != nil {
		return nil, err
	}
	ctx, err := l.openContext(devName)
	if err != nil {
		return nil, err
	}
	info, lim, c, err := l.describe(ctx, devName, port, p.opts)
	if err != nil {
		C.pv_close_device(l.c, ctx)
		return nil, fmt.Errorf("open %s: %w", name, err)
	}
	d := &device{lib: l, name: devName, opts: p.opts, ctx: ctx, lim: lim, spin: p.opts.cqSpin()}
	d.st.Store(&devState{info: info, port: portOf(c, lim, p.opts)})
	d.evs = startAsyncEvents(d)
	return d, nil
}

// portOf is the localPort QPs use on port choice c.
func portOf(c portChoice, lim devLimits, o Options) localPort {
	return localPort{Num: c.Port, Ethernet: c.Ethernet, GRHRequired: c.GRHRequired, GIDIndex: c.GID.Index, MTU: c.MTU,
		PKeyIndex: uint16(o.PKeyIndex), MaxRdAtom: lim.maxRdAtom, MaxInitRd: lim.maxInitRdAtom}
}

// inspectConn runs connParams through the C code that fills ibv_qp_attr
// for RTR and RTS and reads the attributes back, so tests can check the
// structs libibverbs would receive.
func inspectConn(p connParams) (rtr, rts connParams, rtrMask, rtsMask int) {
	in := toC(p)
	var r, s C.pv_conn
	var rm, sm C.int
	C.pv_conn_readback(&in, &r, &rm, &s, &sm)
	return fromC(r), fromC(s), int(rm), int(sm)
}

func toC(p connParams) C.pv_conn {
	c := C.pv_conn{
		path_mtu: C.uint32_t(p.PathMTU), dest_qpn: C.uint32_t(p.DestQPN),
		rq_psn: C.uint32_t(p.RqPSN), sq_psn: C.uint32_t(p.SqPSN),
		max_dest_rd_atomic: C.uint8_t(p.MaxDestRdAtomic), min_rnr_timer: C.uint8_t(p.MinRNRTimer),
		timeout: C.uint8_t(p.Timeout), retry_cnt: C.uint8_t(p.RetryCnt), rnr_retry: C.uint8_t(p.RNRRetry),
		max_rd_atomic: C.uint8_t(p.MaxRdAtomic), port: C.uint8_t(p.Port),
		sgid_index: C.uint8_t(p.SGIDIndex), hop_limit: C.uint8_t(p.HopLimit),
		traffic_class: C.uint8_t(p.TrafficClass), sl: C.uint8_t(p.SL), dlid: C.uint16_t(p.DLID),
	}
	if p.IsGlobal {
		c.is_global = 1
	}
	for i, b := range p.DGID {
		c.dgid[i] = C.uint8_t(b)
	}
	return c
}

func fromC(c C.pv_conn) connParams {
	p := connParams{
		PathMTU: int(c.path_mtu), DestQPN: uint32(c.dest_qpn), RqPSN: uint32(c.rq_psn), SqPSN: uint32(c.sq_psn),
		MaxDestRdAtomic: uint8(c.max_dest_rd_atomic), MinRNRTimer: uint8(c.min_rnr_timer),
		Timeout: uint8(c.timeout), RetryCnt: uint8(c.retry_cnt), RNRRetry: uint8(c.rnr_retry),
		MaxRdAtomic: uint8(c.max_rd_atomic), Port: uint8(c.port), IsGlobal: c.is_global != 0,
		SGIDIndex: uint8(c.sgid_index), HopLimit: uint8(c.hop_limit), TrafficClass: uint8(c.traffic_class),
		SL: uint8(c.sl), DLID: uint16(c.dlid),
	}
	for i := range p.DGID {
		p.DGID[i] = byte(c.dgid[i])
	}
	return p
}
