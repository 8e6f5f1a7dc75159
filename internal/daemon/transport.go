package daemon

import (
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/pegaflow/pegad/internal/config"
	"github.com/pegaflow/pegad/internal/ibv"
	"github.com/pegaflow/pegad/internal/ibv/tcp"
	"github.com/pegaflow/pegad/internal/ibv/verbs"
	"github.com/pegaflow/pegad/internal/metrics"
)

// ErrVerbsUnavailable: --transport verbs was asked for on a host where it
// cannot run.
var ErrVerbsUnavailable = errors.New("transport verbs requested but unavailable")

// transport is the opened data plane: the provider's name, the NICs in
// order, and how to close them.
type transport struct {
	name           string
	reason         string // why this transport (logged once at start)
	reasonCode     string // metrics.Transport{Requested,Auto,Fallback}: pegaflow_transport_info's reason
	verbsAvailable bool
	devices        []ibv.Device
	dataAddrs      []string // tcp: each device's advertised data address, in NIC order
	close          func()
	// reopen opens devices[i] again (verbs: after DEVICE_FATAL); nil: no
	// reopening.
	reopen func(i int) (ibv.Device, error)
}

// tcpConnectTimeout is the ack timeout exponent of QPs on the tcp provider:
// 4.096us * 2^17 ≈ 0.54 s per try, ≈ 4.3 s with the default 7 retries.
// The default (14: ≈ 67 ms per try, ≈ 0.54 s in all) suits a NIC that
// answers in microseconds, but the tcp provider's responder is a goroutine
// that a loaded host (CI under -race, a busy node) can leave unscheduled
// for longer than that, and the requester then fails healthy connections
// with spurious RETRY_EXC_ERR. Verbs keeps the default: a real NIC that
// stays silent for 0.5 s is gone.
const tcpConnectTimeout = 17

// connectAttr are the RC attributes of the QPs of transport name.
func connectAttr(name string, cfg *config.Config) ibv.ConnectAttr {
	a := ibv.DefaultConnectAttr()
	if name == config.TransportTCP {
		a.Timeout = tcpConnectTimeout
	}
	a.TrafficCls, a.SL = uint8(cfg.TrafficClass), uint8(cfg.ServiceLevel)
	if cfg.QPTimeout >= 0 {
		a.Timeout = uint8(cfg.QPTimeout)
	}
	a.RetryCnt = uint8(cfg.QPRetryCount)
	return a
}

// verbsProbeInterval is how often an idle verbs connection is probed with
// a keepalive READ (conn.DialerOptions.ProbeInterval): with the default retry
// budget (about 0.5 s), a dead holder leaves `conns list` within about
// 1.5 s.
const verbsProbeInterval = time.Second

// probeInterval is conn.DialerOptions.ProbeInterval for a transport: verbs only.
func probeInterval(transport string) time.Duration {
	if transport == config.TransportVerbs {
		return verbsProbeInterval
	}
	return 0
}

// verbsOptions are the provider options the config sets.
func verbsOptions(cfg *config.Config) verbs.Options {
	o := verbs.DefaultOptions()
	o.ForceGIDIndex, o.GIDIndex = cfg.GIDIndex >= 0, cfg.GIDIndex
	o.PKeyIndex = cfg.PKeyIndex
	o.NUMANodes, _ = cfg.NICNUMANodes() // validated with the config
	o.CQSpin = cfg.CQBusyPoll
	if o.CQSpin == 0 {
		o.CQSpin = -1 // verbs.Options: negative blocks at once
	}
	return o
}

// verbsProbe is verbs.Available, swappable in tests.
var verbsProbe = verbs.Available

// openTransport picks and opens the transport the config asks for:
// auto → verbs when libibverbs loads and devices exist, else tcp; verbs →
// verbs or a start-up error; tcp → tcp.
func openTransport(cfg *config.Config, met *metrics.Metrics, log zerolog.Logger) (*transport, error) {
	count, names, err := cfg.NICSpec()
	if err != nil {
		return nil, fmt.Errorf("nics: %w", err)
	}
	avail, why := verbsProbe()
	var t *transport
	code := metrics.TransportRequested
	switch cfg.Transport {
	case config.TransportTCP:
		t, err = openTCP(cfg, count, names, "requested", avail, met, log)
	case config.TransportVerbs:
		if !avail {
			return nil, hostMismatch(fmt.Errorf("%w: %s", ErrVerbsUnavailable, why))
		}
		t, err = openVerbs(verbsOptions(cfg), count, names, "requested ("+why+")")
	default: // auto
		if !avail {
			code = metrics.TransportFallback
			t, err = openTCP(cfg, count, names, strings.TrimPrefix(why, "verbs unavailable: "), avail, met, log)
			break
		}
		code = metrics.TransportAuto
		t, err = openVerbs(verbsOptions(cfg), count, names, "auto: "+why)
		if err != nil {
			// Devices exist but cannot be opened as configured: say so, do
			// not silently fall back to tcp on a host meant for RDMA.
			return nil, fmt.Errorf("transport auto found verbs devices (%s) but could not open them: %w", why, err)
		}
	}
	if err != nil {
		return nil, hostMismatch(err)
	}
	t.reasonCode = code
	return t, nil
}

// hostMismatch marks as the configuration's fault (exit 78: systemd's
// RestartPreventExitStatus stops the restart loop) the transport failures
// that no restart cures: verbs asked for on a host without it, NICs the
// host does not have. Others (a tcp data port in use, a device that fails
// to open) stay runtime failures.
func hostMismatch(err error) error {
	if errors.Is(err, ErrVerbsUnavailable) || errors.Is(err, ibv.ErrNoDevice) {
		return config.Invalid(err)
	}
	return err
}

// ErrLoopbackAdvertise: the node would hand peers a loopback address
// although its peer port is reachable from other hosts.
var ErrLoopbackAdvertise = config.NewInvalid("would advertise a loopback address while the peer port listens beyond loopback")

// tcpData is where the tcp devices listen and what host they advertise.
type tcpData struct {
	host string // listen host ("" or a wildcard: all addresses)
	port int    // 0: ephemeral per device; P: device i on P+i
	// advertise is the host peers dial, joined with each device's bound
	// port; "" advertises the bound address as is.
	advertise string
}

// planTCPData applies the rule that makes tcp work across hosts with only
// --listen and --advertise: the data listener takes --listen's host
// (wildcard included) unless --tcp-data-listen names one, and advertises
// --tcp-data-listen's concrete host, else --advertise's host, else
// --listen's concrete host, always with the port actually bound. A plan
// that would hand peers a loopback address while the peer port listens
// beyond loopback is refused, naming the flag that chose it.
func planTCPData(cfg *config.Config) (tcpData, error) {
	listenHost, _, err := net.SplitHostPort(cfg.Listen)
	if err != nil {
		return tcpData{}, fmt.Errorf("listen %q: %w", cfg.Listen, err)
	}
	p := tcpData{host: listenHost}
	advFlag, advValue := "", ""
	if cfg.TCPDataListen != "" {
		h, portStr, err := net.SplitHostPort(cfg.TCPDataListen)
		if err != nil {
			return tcpData{}, fmt.Errorf("tcp-data-listen %q: %w", cfg.TCPDataListen, err)
		}
		p.host = h
		p.port, _ = strconv.Atoi(portStr)
		if !isWildcard(h) {
			p.advertise, advFlag, advValue = h, "tcp-data-listen", cfg.TCPDataListen
		}
	}
	advHost, _, advErr := net.SplitHostPort(cfg.Advertise)
	if p.advertise == "" {
		if advErr == nil && !isWildcard(advHost) {
			p.advertise, advFlag, advValue = advHost, "advertise", cfg.Advertise
		} else if !isWildcard(listenHost) {
			p.advertise = listenHost
		}
	}
	if isLoopback(listenHost) {
		return p, nil // a single-host node: loopback is right
	}
	if advErr == nil && isLoopback(advHost) {
		return tcpData{}, fmt.Errorf("--advertise %s: %w (--listen %s): advertise an address other hosts can dial",
			cfg.Advertise, ErrLoopbackAdvertise, cfg.Listen)
	}
	if isLoopback(p.advertise) {
		return tcpData{}, fmt.Errorf("--%s %s: the tcp data listener %w (--listen %s): drop --%s or give it an address other hosts can dial",
			advFlag, advValue, ErrLoopbackAdvertise, cfg.Listen, advFlag)
	}
	return p, nil
}

// isWildcard: the host listens on every address (empty, 0.0.0.0, ::).
func isWildcard(h string) bool {
	ip := net.ParseIP(h)
	return h == "" || (ip != nil && ip.IsUnspecified())
}

// isLoopback: the host is only reachable from this machine.
func isLoopback(h string) bool {
	l := strings.ToLower(h)
	if l == "localhost" || strings.HasSuffix(l, ".localhost") {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

func openTCP(cfg *config.Config, count int, names []string, reason string, verbsAvail bool, met *metrics.Metrics, log zerolog.Logger) (*transport, error) {
	if reason != "requested" {
		reason = "verbs unavailable: " + reason
	}
	plan, err := planTCPData(cfg)
	if err != nil {
		return nil, err
	}
	opts := make([]tcp.DeviceOptions, count)
	dlog := log.With().Str("component", "tcp").Logger()
	numa, _ := cfg.NICNUMANodes() // validated with the config
	for i := range opts {
		o := tcp.DeviceOptions{QPNStart: cfg.TCPQPNStart, NUMANode: -1, Logger: &dlog, Metrics: met, AdvertiseHost: plan.advertise}
		name := fmt.Sprintf("tcp%d", i) // the provider's default name
		if names != nil {
			o.Name, name = names[i], names[i]
		}
		if n, ok := numa[name]; ok {
			o.NUMANode = n
		}
		p := plan.port
		if p != 0 {
			p += i
		}
		o.ListenAddr = net.JoinHostPort(plan.host, strconv.Itoa(p))
		opts[i] = o
	}
	prov, err := tcp.NewProvider(opts...)
	if err != nil {
		return nil, err // "tcp: device tcp0: listen ...": already names the transport
	}
	infos, err := prov.Devices()
	if err != nil {
		prov.Close()
		return nil, fmt.Errorf("tcp transport: %w", err)
	}
	t := &transport{name: config.TransportTCP, reason: reason, verbsAvailable: verbsAvail,
		close: func() { _ = prov.Close() }}
	for _, in := range infos {
		d, err := prov.Open(in.Name)
		if err != nil {
			prov.Close()
			return nil, fmt.Errorf("tcp transport: %w", err)
		}
		t.devices = append(t.devices, d)
		t.dataAddrs = append(t.dataAddrs, in.Addr)
	}
	if plan.advertise == "" {
		log.Warn().Strs("data_advertise", t.dataAddrs).
			Msg("tcp data listeners advertise a wildcard address that peers on other hosts cannot dial: set --advertise")
	}
	return t, nil
}

func openVerbs(opts verbs.Options, count int, names []string, reason string) (*transport, error) {
	prov := verbs.NewWithOptions(opts)
	infos, err := prov.Devices()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrVerbsUnavailable, err)
	}
	var want []string
	if names != nil {
		have := map[string]bool{}
		for _, in := range infos {
			have[in.Name] = true
		}
		for _, n := range names {
			if !have[n] {
				return nil, fmt.Errorf("nics: verbs device %q not found (have %s): %w", n, deviceNames(infos), ibv.ErrNoDevice)
			}
		}
		want = names
	} else {
		if count > len(infos) {
			return nil, fmt.Errorf("nics: %d verbs devices asked for, %d present (%s): %w", count, len(infos), deviceNames(infos), ibv.ErrNoDevice)
		}
		for _, in := range infos[:count] {
			want = append(want, in.Name)
		}
	}
	t := &transport{name: config.TransportVerbs, reason: reason, verbsAvailable: true}
	for _, n := range want {
		d, err := prov.Open(n)
		if err != nil {
			for _, o := range t.devices {
				_ = o.Close()
			}
			return nil, fmt.Errorf("verbs: open %s: %w", n, err)
		}
		t.devices = append(t.devices, d)
	}
	devs := t.devices
	t.close = func() {
		for _, d := range devs {
			_ = d.Close()
		}
	}
	t.reopen = func(i int) (ibv.Device, error) { return prov.Open(want[i]) }
	return t, nil
}

func deviceNames(infos []ibv.DeviceInfo) string {
	if len(infos) == 0 {
		return "none"
	}
	s := make([]string, len(infos))
	for i, in := range infos {
		s[i] = in.Name
	}
	return strings.Join(s, ",")
}

// nicNames are the opened devices' names, in NIC order.
func (t *transport) nicNames() []string {
	out := make([]string, len(t.devices))
	for i, d := range t.devices {
		out[i] = d.Info().Name
	}
	return out
}

// hostNUMANodes counts the host's NUMA nodes (sysfs); a variable so tests
// can pretend a host has several.
var hostNUMANodes = func() int {
	m, _ := filepath.Glob("/sys/devices/system/node/node[0-9]*")
	return len(m)
}

// checkNICNUMA refuses a nic-numa naming a NIC pegad did not open (a typo
// would otherwise leave that NIC unplaced without a word), and logs each
// NIC's NUMA node and where it came from. A NIC with none is a warning on
// a multi-node host: its pool part cannot be bound to it, and READs
// cannot be kept on its node. rxe and some VMs' NICs have no numa_node in
// sysfs; nic-numa names it.
func checkNICNUMA(cfg *config.Config, devices []ibv.Device, log zerolog.Logger) error {
	named, err := cfg.NICNUMANodes()
	if err != nil {
		return fmt.Errorf("nic-numa: %w", err)
	}
	opened := make(map[string]bool, len(devices))
	for _, d := range devices {
		opened[d.Info().Name] = true
	}
	for name := range named {
		if !opened[name] {
			return config.NewInvalid(fmt.Sprintf("nic-numa names %s, which is not one of the NICs pegad opened", name))
		}
	}
	hostNodes := hostNUMANodes()
	for _, d := range devices {
		in := d.Info()
		switch n, ok := named[in.Name]; {
		case ok:
			log.Info().Str("nic", in.Name).Int("numa_node", n).Msg("NIC NUMA node named by nic-numa")
		case in.NUMANode >= 0:
			log.Debug().Str("nic", in.Name).Int("numa_node", in.NUMANode).Msg("NIC NUMA node from sysfs")
		case hostNodes > 1:
			log.Warn().Str("nic", in.Name).Int("host_numa_nodes", hostNodes).
				Msg("NIC has no NUMA node (none in sysfs, none named): its pool part is not bound to a node; name it with --nic-numa NIC=NODE")
		default:
			log.Info().Str("nic", in.Name).Msg("NIC has no NUMA node (single-node host: nothing to bind)")
		}
	}
	return nil
}
