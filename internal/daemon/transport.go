package daemon

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"

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
	verbsAvailable bool
	devices        []ibv.Device
	close          func()
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
func connectAttr(name string) ibv.ConnectAttr {
	a := ibv.DefaultConnectAttr()
	if name == config.TransportTCP {
		a.Timeout = tcpConnectTimeout
	}
	return a
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
	switch cfg.Transport {
	case config.TransportTCP:
		return openTCP(cfg, count, names, "requested", avail, met, log)
	case config.TransportVerbs:
		if !avail {
			return nil, fmt.Errorf("%w: %s", ErrVerbsUnavailable, why)
		}
		return openVerbs(count, names, "requested ("+why+")")
	default: // auto
		if !avail {
			return openTCP(cfg, count, names, strings.TrimPrefix(why, "verbs unavailable: "), avail, met, log)
		}
		t, err := openVerbs(count, names, "auto: "+why)
		if err != nil {
			// Devices exist but cannot be opened as configured: say so, do
			// not silently fall back to tcp on a host meant for RDMA.
			return nil, fmt.Errorf("transport auto found verbs devices (%s) but could not open them: %w", why, err)
		}
		return t, nil
	}
}

func openTCP(cfg *config.Config, count int, names []string, reason string, verbsAvail bool, met *metrics.Metrics, log zerolog.Logger) (*transport, error) {
	if reason != "requested" {
		reason = "verbs unavailable: " + reason
	}
	host, portStr, err := net.SplitHostPort(cfg.TCPDataListen)
	if err != nil {
		return nil, fmt.Errorf("tcp-data-listen %q: %w", cfg.TCPDataListen, err)
	}
	port, _ := strconv.Atoi(portStr)
	opts := make([]tcp.DeviceOptions, count)
	dlog := log.With().Str("component", "tcp").Logger()
	for i := range opts {
		o := tcp.DeviceOptions{QPNStart: cfg.TCPQPNStart, NUMANode: -1, Logger: &dlog, Metrics: met}
		if names != nil {
			o.Name = names[i]
		}
		p := port
		if port != 0 {
			p = port + i
		}
		o.ListenAddr = net.JoinHostPort(host, strconv.Itoa(p))
		// A wildcard listener cannot be dialled from another host: advertise
		// the node's advertised host instead, when the port is known now.
		if ip := net.ParseIP(host); (host == "" || (ip != nil && ip.IsUnspecified())) && p != 0 {
			if ah := advertiseHost(cfg); ah != "" {
				o.Advertise = net.JoinHostPort(ah, strconv.Itoa(p))
			}
		}
		opts[i] = o
	}
	prov, err := tcp.NewProvider(opts...)
	if err != nil {
		return nil, fmt.Errorf("tcp transport: %w", err)
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
	}
	return t, nil
}

// advertiseHost is the host part of --advertise, else of --listen when it
// is a concrete address; "" when neither names one.
func advertiseHost(cfg *config.Config) string {
	for _, a := range []string{cfg.Advertise, cfg.Listen} {
		if h, _, err := net.SplitHostPort(a); err == nil && h != "" {
			if ip := net.ParseIP(h); ip == nil || !ip.IsUnspecified() {
				return h
			}
		}
	}
	return ""
}

func openVerbs(count int, names []string, reason string) (*transport, error) {
	prov := verbs.New()
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
			return nil, fmt.Errorf("nics: %d verbs devices asked for, %d present (%s)", count, len(infos), deviceNames(infos))
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
