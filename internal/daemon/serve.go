package daemon

// The servers: the peer port, the local socket, the data socket beside it,
// /metrics and /healthz, each started on the listener bind took before the
// pool, and each Serve loop in a goroutine the daemon owns.

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	grpcprom "github.com/grpc-ecosystem/go-grpc-middleware/providers/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/internal/holder"
	"github.com/pegaflow/pegad/internal/localapi"
	"github.com/pegaflow/pegad/internal/localdata"
	"github.com/pegaflow/pegad/internal/metrics"
	"github.com/pegaflow/pegad/internal/netgate"
)

// listen opens and serves the peer port, the local socket, the data
// socket, the metrics endpoint and, with --debug-listen, the debug one.
func (d *Daemon) listen() error {
	srvMetrics := grpcprom.NewServerMetrics()
	if err := d.reg.Register(srvMetrics); err != nil {
		return fmt.Errorf("grpc metrics: %w", err)
	}
	d.servePeer(srvMetrics)
	engine := metrics.NewEngine(d.reg) // the data socket's lookups, shown by Stats too
	// Puts of evicted blocks, beside the lookups: the hit-ratio ceiling.
	d.store.OnRecomputed(engine.Recomputed)
	d.serveLocal(srvMetrics, engine)
	d.serveData(engine)
	if d.bound.metrics != nil {
		d.serveMetrics()
	}
	if d.bound.debug != nil {
		d.serveDebug(d.gated(metrics.PortDebug, take(&d.bound.debug), netgate.HTTP1()))
	}
	return nil
}

// servePeer serves the holder's PeerService and health on the peer port.
func (d *Daemon) servePeer(srvMetrics *grpcprom.ServerMetrics) {
	peerLis, connTimeout := d.gatedGRPC(metrics.PortPeer, take(&d.bound.peer), d.tls != nil)
	d.warnPlaintext(peerLis.Addr())
	secOpts, peerUnary, peerStream := d.peerServerOptions()
	peerUnary = append(peerUnary, srvMetrics.UnaryServerInterceptor(), holder.RecoveryInterceptor(d.log), d.drainInterceptor())
	if d.opts.peerInterceptor != nil {
		peerUnary = append(peerUnary, d.opts.peerInterceptor)
	}
	d.peerSrv = grpc.NewServer(append(secOpts, connTimeout,
		grpc.ChainUnaryInterceptor(peerUnary...),
		grpc.ChainStreamInterceptor(append(peerStream, srvMetrics.StreamServerInterceptor(), streamRecovery(d.log))...),
	)...)
	pegadv1.RegisterPeerServiceServer(d.peerSrv, d.holder)
	d.peerHealth = health.NewServer()
	d.peerHealth.SetServingStatus(pegadv1.PeerService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(d.peerSrv, d.peerHealth)
	if d.cfg.PeerReflection {
		reflection.Register(d.peerSrv)
	}
	srvMetrics.InitializeMetrics(d.peerSrv)
	d.serve("peer", func() error { return d.peerSrv.Serve(peerLis) })
}

// serveLocal serves the LocalService, AdminService, the cluster service
// and health on the local unix socket.
func (d *Daemon) serveLocal(srvMetrics *grpcprom.ServerMetrics, engine *metrics.Engine) {
	cfg := &d.cfg
	localLis, connTimeout := d.gatedGRPC(metrics.PortLocal, take(&d.bound.local), false)
	d.socket = cfg.Socket
	d.localSrv = grpc.NewServer(
		grpc.Creds(localapi.PeerCredentials()), connTimeout,
		grpc.MaxRecvMsgSize(localapi.MaxRecvMsgSize),
		grpc.ChainUnaryInterceptor(srvMetrics.UnaryServerInterceptor(), holder.RecoveryInterceptor(d.log), d.drainInterceptor()),
		grpc.ChainStreamInterceptor(srvMetrics.StreamServerInterceptor(), streamRecovery(d.log)),
	)
	d.local = localapi.NewLocal(localapi.LocalOptions{
		Store:     d.store,
		Fetcher:   d.fetch,
		Handoffs:  d.handoffs,
		NodeID:    cfg.NodeID,
		Advertise: d.advertise,
		Log:       d.log.With().Str("component", "localapi").Logger(),
	})
	pegadv1.RegisterLocalServiceServer(d.localSrv, d.local)
	pegadv1.RegisterAdminServiceServer(d.localSrv, localapi.NewAdmin(localapi.AdminOptions{
		Engine:   engine,
		Store:    d.store,
		Locks:    d.holder.Locks(),
		Conns:    d.connsListing(),
		Fetcher:  d.engine,
		Handoffs: d.handoffs,
		Metrics:  d.metrics,
		Node: localapi.NodeInfo{
			NodeID: cfg.NodeID, Incarnation: d.incarnation, Transport: d.tr.name,
			VerbsAvailable: d.tr.verbsAvailable, Started: d.started,
		},
		Log: d.log.With().Str("component", "admin").Logger(),
	}))
	d.registerCluster()
	d.localHealth = health.NewServer()
	for _, svc := range []string{pegadv1.LocalService_ServiceDesc.ServiceName, pegadv1.AdminService_ServiceDesc.ServiceName} {
		d.localHealth.SetServingStatus(svc, healthpb.HealthCheckResponse_SERVING)
	}
	healthpb.RegisterHealthServer(d.localSrv, d.localHealth)
	reflection.Register(d.localSrv)
	srvMetrics.InitializeMetrics(d.localSrv)
	d.serve("local", func() error { return d.localSrv.Serve(localLis) })
}

// serveData serves the data socket: the pool's memfd and zero-copy leases
// for local clients.
func (d *Daemon) serveData(engine *metrics.Engine) {
	dataLis := take(&d.bound.data)
	d.data = localdata.New(localdata.Options{
		Store:        d.store,
		LeaseTimeout: d.cfg.LockTimeout,
		Metrics:      d.reg,
		Engine:       engine,
		Locator:      d.locator(),
		Self:         d.cfg.NodeID,
		Refused:      d.halfOpenRefused(metrics.PortData),
		Log:          d.log.With().Str("component", "localdata").Logger(),
	})
	d.serve("data", func() error { return d.data.Serve(dataLis) })
}

// serveMetrics serves /metrics and /healthz (503 "starting" until READY,
// "draining" once shutdown began).
func (d *Daemon) serveMetrics() {
	ml := d.gated(metrics.PortMetrics, take(&d.bound.metrics), netgate.HTTP1())
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(d.reg, promhttp.HandlerOpts{Registry: d.reg}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		if !d.serving.Load() {
			msg := "starting"
			if d.draining.Load() {
				msg = DrainingMessage
			}
			http.Error(w, msg, http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	d.httpSrv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	d.serve("metrics", func() error {
		if err := d.httpSrv.Serve(ml); !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	})
}

// serve runs fn in a goroutine owned by d (stopped by Close). A Serve loop
// that ends before shutdown marks the daemon unhealthy (no watchdog ping).
func (d *Daemon) serve(name string, fn func() error) {
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		err := fn()
		if err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			d.log.Error().Err(err).Str("server", name).Msg("Server stopped with an error")
		}
		if !d.draining.Load() {
			d.serverDown.CompareAndSwap(nil, &name)
		}
	}()
}
