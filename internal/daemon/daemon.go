// Package daemon wires pegad together: it builds every component from a
// validated config (pool, store, transport, connections, holder, prefetch
// engine, lock sweeper), serves the peer port, the local unix socket and the
// metrics endpoint, and shuts all of it down in order.
//
// It owns the goroutines it starts (servers, sweeper, watchdog) and stops
// them in Close; it must never hold business logic of its own: what a
// component decides stays in that component.
package daemon

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"

	"github.com/pegaflow/pegad/internal/config"
	"github.com/pegaflow/pegad/internal/conn"
	"github.com/pegaflow/pegad/internal/evict"
	"github.com/pegaflow/pegad/internal/handoff"
	"github.com/pegaflow/pegad/internal/holder"
	"github.com/pegaflow/pegad/internal/ibv/tcp"
	"github.com/pegaflow/pegad/internal/kvevents"
	"github.com/pegaflow/pegad/internal/localapi"
	"github.com/pegaflow/pegad/internal/localdata"
	"github.com/pegaflow/pegad/internal/logging"
	"github.com/pegaflow/pegad/internal/metrics"
	"github.com/pegaflow/pegad/internal/peer"
	"github.com/pegaflow/pegad/internal/peertls"
	"github.com/pegaflow/pegad/internal/pool"
	"github.com/pegaflow/pegad/internal/requester"
	"github.com/pegaflow/pegad/internal/ssd"
	"github.com/pegaflow/pegad/internal/store"
	"github.com/pegaflow/pegad/internal/version"
)

// Option adjusts Start (tests).
type Option func(*options)

type options struct {
	log    *zerolog.Logger
	notify func(state string) // sd_notify; nil: go-systemd's SdNotify
	// faults is the prefetch engine's fault hook (nil in production).
	faults func(ctx context.Context, reqID, phase string)
	// peerInterceptor, when set, is the innermost unary interceptor of the
	// peer server (tests inject holder errors with it).
	peerInterceptor grpc.UnaryServerInterceptor
	// reload reads the configuration again for SIGHUP (quota.go); nil:
	// SIGHUP reloads only the peer TLS files.
	reload func() (config.Config, error)
}

// WithLogger makes the daemon log to l instead of building a logger from
// the config's log-level and log-format.
func WithLogger(l zerolog.Logger) Option { return func(o *options) { o.log = &l } }

// WithNotify replaces sd_notify (tests observe READY/STOPPING).
func WithNotify(f func(state string)) Option { return func(o *options) { o.notify = f } }

// WithRequesterFaults installs a fault hook in the prefetch engine: f runs
// as every fetch enters each phase and may panic or block (see
// requester.Engine.SetFaultHook). Tests only.
func WithRequesterFaults(f func(ctx context.Context, reqID, phase string)) Option {
	return func(o *options) { o.faults = f }
}

// WithPeerInterceptor adds i as the innermost unary interceptor of the peer
// server, inside the metrics and panic-recovery interceptors, so it sees
// each holder RPC just around its handler: it may fail a call before the
// handler runs, or after it ran (the holder's state changed but the caller
// gets an error). Tests only.
func WithPeerInterceptor(i grpc.UnaryServerInterceptor) Option {
	return func(o *options) { o.peerInterceptor = i }
}

// Daemon is a running pegad. Start creates one; Close stops it.
type Daemon struct {
	cfg         config.Config
	opts        options
	log         zerolog.Logger
	notify      func(string)
	incarnation string
	started     time.Time

	reg     *prometheus.Registry
	metrics *metrics.Metrics

	pool  *pool.Pool
	store *store.Store
	tier  *ssd.Tier // nil without --ssd-path
	tr    *transport
	tls   *peertls.Source // nil: plaintext peer port (security.go)
	peers *peer.Clients
	// nics, dialer and acceptor: the NIC set and the requester and
	// holder halves of the RDMA connections over it (openConns); the
	// halves close before the NIC set.
	nics     *conn.NICs
	dialer   *conn.Dialer
	acceptor *conn.Acceptor
	holder   *holder.Service
	engine   *requester.Engine
	// fetch is the engine as the local API uses it (cluster index,
	// known-peer checks); handoffs the node's P/D handoffs and pd their
	// metrics.
	fetch    *requester.Cluster
	handoffs *handoff.Table
	pd       *metrics.PD
	local    *localapi.Local // its Wait: no handler touches pool memory any more
	// cluster: the cluster index client and publisher (cluster.go).
	cluster cluster
	// kv: the KV-events publisher (kvevents.go); nil when off.
	kv *kvevents.Publisher

	peerSrv, localSrv       *grpc.Server
	data                    *localdata.Server // the zero-copy data socket beside the local one
	peerHealth, localHealth *health.Server
	httpSrv                 *http.Server
	debugSrv                *http.Server // --debug-listen; nil when off
	peerAddr, metricsAddr   string
	debugAddr               string
	bound                   boundListeners // ports bound before the pool; see bind
	socket                  string
	advertise               string
	serving                 atomic.Bool // /healthz: true between READY and shutdown
	ready                   bool        // Start completed; set before Start returns
	// draining: shutdown began; new sessions, handshakes, prefetches and handoffs
	// are refused (drainInterceptor), granted work goes on.
	draining atomic.Bool
	// sweeps records the lock sweeper's ticks for the watchdog.
	sweeps sweepClock
	// serverDown names a server whose Serve loop ended before shutdown.
	serverDown atomic.Pointer[string]

	// cancel stops the background goroutines (sweeper, watchdog); wg waits
	// for them and for the servers' Serve loops.
	cancel context.CancelFunc
	wg     sync.WaitGroup

	closeOnce sync.Once
	closeErr  error
}

// Run starts pegad, reports READY to systemd, serves until ctx is done
// (SIGTERM/SIGINT in cmd), then shuts down gracefully.
func Run(ctx context.Context, cfg config.Config, opts ...Option) error {
	d, err := Start(ctx, cfg, opts...)
	if err != nil {
		return err
	}
	<-ctx.Done()
	d.log.Info().Msg("Shutting down")
	return d.Close()
}

// Start builds and starts every component and listener. On error, what was
// started is stopped again. The context only bounds start-up; stop the
// daemon with Close.
//
// Its phases, in order: newDaemon (config, logger, identity), openMetrics,
// openPorts (every port before anything slow), openDataPlane (transport
// and its checks), openPool, openComponents, startServing (sweeper,
// servers, self-check) and announceReady (READY=1, watchdog).
func Start(ctx context.Context, cfg config.Config, opts ...Option) (d *Daemon, err error) {
	d, err = newDaemon(cfg, opts)
	if err != nil {
		return nil, err
	}
	stopExtend := extendStart(d.notify)
	defer stopExtend()
	defer func() {
		if err != nil {
			d.log.Error().Err(err).Msg("Start-up failed")
			d.bound.closeUnserved()
			_ = d.Close()
			d = nil
		}
	}()
	if err := ctx.Err(); err != nil {
		return d, err
	}
	for _, k := range config.UnknownEnv(os.Environ()) {
		d.log.Warn().Str("env", k).Msg("Ignoring environment variable: not a pegad setting")
	}
	d.openMetrics()
	if err := d.openPorts(); err != nil {
		return d, err
	}
	if err := d.openDataPlane(&cfg); err != nil {
		return d, err
	}
	if err := d.openPool(&cfg); err != nil {
		return d, err
	}
	if err := d.openComponents(&cfg); err != nil {
		return d, err
	}
	bg, err := d.startServing(ctx)
	if err != nil {
		return d, err
	}
	d.announceReady(bg, &cfg, stopExtend)
	return d, nil
}

// newDaemon is a Daemon of a validated cfg with its options, logger,
// sd_notify and incarnation; nothing is opened yet.
func newDaemon(cfg config.Config, opts []Option) (*Daemon, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	var o options
	for _, f := range opts {
		f(&o)
	}
	d := &Daemon{cfg: cfg, opts: o, started: time.Now(), notify: o.notify}
	if o.log != nil {
		d.log = *o.log
	} else {
		l, err := logging.New(os.Stderr, cfg.LogLevel, cfg.LogFormat)
		if err != nil {
			return nil, err
		}
		d.log = l
	}
	if d.notify == nil {
		d.notify = func(state string) { _, _ = daemon.SdNotify(false, state) }
	}
	d.incarnation = newIncarnation()
	d.log = d.log.With().Str("node", cfg.NodeID).Logger()
	return d, nil
}

// openMetrics makes the daemon's private registry and metrics.
func (d *Daemon) openMetrics() {
	d.reg = prometheus.NewRegistry()
	d.metrics = metrics.New(d.reg, true)
	d.metrics.SetBuildInfo(version.Version, version.CommitOrVCS(), version.GoVersion())
}

// openPorts binds every port first: a port in use fails now, not after the
// pool.
func (d *Daemon) openPorts() error {
	if err := d.bind(); err != nil {
		return err
	}
	return d.bindKVEvents()
}

// openDataPlane opens the transport and checks what it needs of the host
// before the pool is mapped: NIC and NUMA placement, and with verbs the
// memlock limit every NIC's registration of the whole pool needs.
func (d *Daemon) openDataPlane(cfg *config.Config) (err error) {
	d.tr, err = openTransport(cfg, d.metrics, d.log)
	if err != nil {
		return err
	}
	d.log.Info().Str("transport", d.tr.name).Str("reason", d.tr.reason).Int("nics", len(d.tr.devices)).
		Strs("data_addrs", d.tr.dataAddrs).Msg("Transport selected")
	d.metrics.SetTransport(d.tr.name, d.tr.reasonCode)
	if err := checkNICNUMA(cfg, d.tr.devices, d.log); err != nil {
		return err
	}
	if d.tr.name == config.TransportVerbs {
		// Before mapping: each NIC's registration pins the whole pool.
		if err := pool.CheckPinLimit(uint64(cfg.PoolSize), len(d.tr.devices)); err != nil {
			return err
		}
	}
	return nil
}

// startServing starts the background goroutines and the servers, proves
// every endpoint answers, then starts the publishers. It returns the
// context of the background goroutines (cancelled by d.cancel).
func (d *Daemon) startServing(ctx context.Context) (context.Context, error) {
	bg, cancel := context.WithCancel(context.Background())
	d.cancel = cancel
	d.startReloader(bg)

	if err := d.listen(); err != nil {
		return nil, err
	}
	d.startSweeper(bg)
	// READY=1 promises systemd that every endpoint serves: prove it.
	if err := d.checkServing(ctx); err != nil {
		return nil, fmt.Errorf("self-check before READY: %w", err)
	}
	d.startPublisher(bg)
	d.startKVEvents(bg)
	return bg, nil
}

// announceReady marks the daemon ready and serving, ends the start-up's
// timeout extensions, sends READY=1, starts the watchdog and logs what
// runs where.
func (d *Daemon) announceReady(bg context.Context, cfg *config.Config, stopExtend func()) {
	d.ready = true
	d.serving.Store(true)
	stopExtend()
	d.notify(daemon.SdNotifyReady)
	d.startWatchdog(bg)
	d.log.Info().Str("version", version.Version).Str("incarnation", d.incarnation).
		Str("transport", d.tr.name).Strs("nics", d.tr.nicNames()).Strs("data_addrs", d.tr.dataAddrs).
		Str("listen", d.peerAddr).Str("advertise", d.advertise).Str("socket", d.socket).
		Str("metrics", d.metricsAddr).Str("pool_size", cfg.PoolSize.String()).
		Bool("pool_locked", d.pool.Locked()).Stringer("lock_timeout", cfg.LockTimeout).
		Msg("pegad ready")
}

// openPool maps the pool (one part per NUMA node that has NICs, bound to
// it), puts the store on it and, with --ssd-path, the SSD tier under it.
func (d *Daemon) openPool(cfg *config.Config) (err error) {
	// One part of the pool per NUMA node that has NICs, bound to it.
	var nodes []int
	for _, dev := range d.tr.devices {
		nodes = append(nodes, dev.Info().NUMANode)
	}
	if d.pool, err = newPool(cfg.PoolSize, cfg.PoolHugePages, nodes, d.log); err != nil {
		return err
	}
	kind, err := evict.ParseKind(cfg.Eviction)
	if err != nil {
		return err // config validation refuses it first
	}
	d.store = store.NewWithPolicy(d.pool, d.metrics, store.NewPolicy(kind))
	d.log.Info().Str("policy", string(kind)).Msg("Eviction policy")
	if err := d.applyQuotas(cfg); err != nil {
		return err
	}
	if err := d.openTier(); err != nil {
		return err
	}
	pl := d.pool
	d.metrics.SetPoolParts(func() []metrics.PoolPart {
		var out []metrics.PoolPart
		for _, pt := range pl.PartStats() {
			out = append(out, metrics.PoolPart{Node: pt.Node, Size: pt.Size, Used: pt.Used})
		}
		return out
	})
	return nil
}

// openComponents builds what serves and fetches blocks over the pool: the
// peer clients (with TLS), the connections (NIC set, Dialer, Acceptor),
// the holder, the prefetch engine and, with --cluster-redis, the cluster
// index.
func (d *Daemon) openComponents(cfg *config.Config) (err error) {
	if err := d.setupPeerTLS(); err != nil {
		return err
	}
	d.peers = peer.NewClientsWithOptions(d.peerClientOptions()...)
	d.pd = metrics.NewPD(d.reg)
	if d.handoffs, err = handoff.New(handoff.Options{
		Store: d.store, Metrics: d.pd, Log: d.log.With().Str("component", "handoff").Logger(),
	}); err != nil {
		return err
	}
	if err := d.openConns(cfg); err != nil {
		return fmt.Errorf("connections: %w", err)
	}
	var windows holder.Windows
	if d.acceptor.WindowsEnabled() {
		windows = d.acceptor
	}
	d.holder, err = holder.New(holder.Options{
		Store:       d.store,
		Acceptor:    d.acceptor,
		Windows:     windows,
		Metrics:     d.metrics,
		Log:         d.log.With().Str("component", "holder").Logger(),
		NodeID:      cfg.NodeID,
		Incarnation: d.incarnation,
		LockTimeout: cfg.LockTimeout,
		MaxLifetime: cfg.EffectiveLockMaxLifetime(),

		Limits:       d.holderLimits(),
		Authenticate: d.authenticator(),
		Handoffs:     d.handoffs,
	})
	if err != nil {
		return err
	}
	// verbs: the reaper frees a requester's connection once it has held
	// no transfer session for --rdma-idle-timeout.
	d.acceptor.SetRequesterActivity(d.holder.Locks())
	d.engine, err = requester.New(requester.Options{
		NodeID:      cfg.NodeID,
		Incarnation: d.incarnation,
		Store:       d.store,
		Conns:       d.dialer,
		Peers:       d.peers.Get,
		Metrics:     d.metrics,
		Log:         d.log.With().Str("component", "requester").Logger(),
	})
	if err != nil {
		return fmt.Errorf("prefetch engine: %w", err)
	}
	if d.opts.faults != nil {
		d.engine.SetFaultHook(d.opts.faults)
	}
	if err := d.openCluster(); err != nil {
		return err
	}
	return d.openFetcher()
}

// Close shuts down in order (docs/operations.md "Shutdown"):
//
//  1. announce: health NOT_SERVING, /healthz 503 "draining", STOPPING=1;
//     new sessions, handshakes, prefetches and handoffs get UNAVAILABLE "draining";
//     the node leaves the cluster index, so requesters stop choosing it;
//  2. drain until no fetch runs here and no peer holds a session here, or
//     until shutdown-timeout (reads of granted sessions, releases and
//     renewals are served meanwhile);
//  3. prefetch engine: abort what is left (its guards release the locks);
//  4. holder: release the sessions peers still hold;
//  5. peer port, lease sweeper, watchdog;
//  6. local socket and /metrics, the last to go, so pegactl and scrapes
//     work throughout;
//  7. connections, peer clients, transport, pool.
//
// Safe to call more than once; later calls return the first result.
func (d *Daemon) Close() error {
	d.closeOnce.Do(func() { d.closeErr = d.shutdown() })
	return d.closeErr
}

// shutdown runs Close's steps, each a phase below; stopBy bounds each
// server's stop by what is left of shutdown-timeout (minStopGrace at
// least).
func (d *Daemon) shutdown() error {
	start := time.Now()
	deadline := start.Add(d.cfg.ShutdownTimeout)
	stopBy := func() time.Duration { return max(time.Until(deadline), minStopGrace) }

	d.announceShutdown()
	d.drainWork(deadline)
	errs := d.stopWork(stopBy)
	d.stopLocal(stopBy)
	errs = append(errs, d.closeDataPlane(stopBy)...)
	err := errors.Join(errs...)
	switch {
	case err != nil:
		d.log.Error().Err(err).Msg("Shutdown finished with errors")
	case d.ready:
		d.log.Info().Float64("took", time.Since(start).Seconds()).Msg("Shutdown complete")
	}
	return err
}

// announceShutdown is step 1: health NOT_SERVING, /healthz "draining",
// STOPPING=1, new work refused, the node out of the cluster index.
func (d *Daemon) announceShutdown() {
	d.draining.Store(true)
	d.serving.Store(false)
	if d.peerHealth != nil {
		d.peerHealth.Shutdown()
	}
	if d.localHealth != nil {
		d.localHealth.Shutdown()
	}
	if d.notify != nil {
		d.notify(daemon.SdNotifyStopping)
	}
	d.leaveCluster()
}

// drainWork is step 2: wait, until deadline, for the fetches running here
// and the sessions peers hold here to finish (only once Start completed).
func (d *Daemon) drainWork(deadline time.Time) {
	if !d.ready {
		return
	}
	d.log.Info().Stringer("shutdown_timeout", d.cfg.ShutdownTimeout).
		Msg("Draining: refusing new sessions and prefetches; serving granted ones")
	if !d.drain(deadline) {
		d.logDrain(len(d.engine.InFlight()), d.holder.Locks().Len(), 0)
		d.log.Warn().Msg("Shutdown timeout: aborting the fetches and releasing the sessions above")
	}
}

// stopWork is steps 3 to 5: the prefetch engine aborts what is left (its
// guards release the locks on peers), the peer port stops, the holder
// releases the sessions peers still hold, and the background goroutines
// (lease sweeper, watchdog, publishers) are told to stop.
func (d *Daemon) stopWork(stopBy func() time.Duration) (errs []error) {
	if d.engine != nil {
		if err := d.engine.Close(); err != nil {
			errs = append(errs, fmt.Errorf("prefetch engine: %w", err))
		}
	}
	// A query that passed the drain check just before it was set
	// finishes here, so the release below sees its session.
	if d.peerSrv != nil {
		gracefulStop(d.peerSrv, stopBy())
	}
	if d.holder != nil {
		if n := d.holder.Locks().ReleaseAll("shutdown"); n > 0 {
			d.log.Info().Int("sessions", n).Msg("Released holder sessions at shutdown")
		}
	}
	if d.cancel != nil {
		d.cancel()
	}
	return errs
}

// stopLocal is step 6: the local socket and /metrics (and the debug
// endpoint) go last, so pegactl and scrapes work throughout; then every
// local lease ends and the daemon's goroutines are waited for.
func (d *Daemon) stopLocal(stopBy func() time.Duration) {
	var stopWG sync.WaitGroup
	if d.localSrv != nil {
		stopWG.Add(1)
		go func() {
			defer stopWG.Done()
			gracefulStop(d.localSrv, stopBy())
		}()
	}
	for _, srv := range []*http.Server{d.httpSrv, d.debugSrv} {
		if srv == nil {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), stopBy())
		if err := srv.Shutdown(ctx); err != nil {
			_ = srv.Close()
		}
		cancel()
	}
	stopWG.Wait()
	if d.data != nil {
		// Ends every local lease: nothing may hold pool memory past here.
		_ = d.data.Close()
	}
	if d.handoffs != nil {
		if n := d.handoffs.Close(); n > 0 {
			d.log.Info().Int("handoffs", n).Msg("Ended pending handoffs at shutdown")
		}
	}
	d.wg.Wait()
	if d.store != nil {
		d.closeCluster()
	}
	d.closeKVEvents()
}

// closeDataPlane is step 7: connections, peer clients, transport, the SSD
// tier and the pool, once no handler can touch pool memory.
func (d *Daemon) closeDataPlane(stopBy func() time.Duration) (errs []error) {
	errs = append(errs, d.closeConns()...)
	if d.peers != nil {
		if err := d.peers.Close(); err != nil {
			errs = append(errs, fmt.Errorf("peer clients: %w", err))
		}
	}
	if d.tr != nil && d.tr.close != nil {
		d.tr.close()
	}
	if d.local != nil {
		// A hard Stop (graceful stop timed out) does not wait for
		// handlers: one may still be copying pool memory.
		d.local.Wait()
	}
	if err := d.closeTier(time.Now().Add(stopBy())); err != nil {
		errs = append(errs, err)
	}
	if d.pool != nil {
		if err := d.pool.Close(); err != nil {
			errs = append(errs, fmt.Errorf("pool: %w", err))
		}
	}
	return errs
}

// gracefulStop drains s, falling back to a hard Stop after timeout.
func gracefulStop(s *grpc.Server, timeout time.Duration) {
	done := make(chan struct{})
	go func() {
		s.GracefulStop()
		close(done)
	}()
	t := time.NewTimer(max(timeout, 0))
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		s.Stop()
		<-done
	}
}

func newIncarnation() string {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(fmt.Sprintf("crypto/rand: %v", err))
	}
	return hex.EncodeToString(b[:])
}

// Accessors for tests and operators' tooling.

// PeerAddr is the bound peer gRPC address.
func (d *Daemon) PeerAddr() string { return d.peerAddr }

// SocketPath is the local API's unix socket.
func (d *Daemon) SocketPath() string { return d.socket }

// MetricsAddr is the bound metrics address ("" when disabled).
func (d *Daemon) MetricsAddr() string { return d.metricsAddr }

// DebugAddr is the bound --debug-listen address ("" when off).
func (d *Daemon) DebugAddr() string { return d.debugAddr }

// Incarnation is this start's random id.
func (d *Daemon) Incarnation() string { return d.incarnation }

// Transport is the provider in use ("tcp" or "verbs").
func (d *Daemon) Transport() string { return d.tr.name }

// Registry is the daemon's private metrics registry.
func (d *Daemon) Registry() *prometheus.Registry { return d.reg }

// Config is the configuration the daemon runs with.
func (d *Daemon) Config() config.Config { return d.cfg }

// TCPDevices are the tcp provider's devices in NIC order, for tests that
// inject transport faults (SetFaults, CutConnections); nil with verbs.
func (d *Daemon) TCPDevices() []*tcp.Device {
	var out []*tcp.Device
	for _, dev := range d.tr.devices {
		if td, ok := dev.(*tcp.Device); ok {
			out = append(out, td)
		}
	}
	return out
}

// Dialer is the requester half of the connections (tests invalidate
// connections with it).
func (d *Daemon) Dialer() *conn.Dialer { return d.dialer }

// Conns lists both halves' connections and their QPs.
func (d *Daemon) Conns() conn.Listing { return d.connsListing() }
