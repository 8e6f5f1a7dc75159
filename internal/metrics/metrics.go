// Package metrics defines every Prometheus metric pegad exports, under the
// names operators' dashboards depend on (see DESIGN.md "Contracts").
//
// It owns the metric definitions only; components update them. It must never
// hold references to components, so any package can import it.
package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	dto "github.com/prometheus/client_model/go"
)

// Holder RPC names used as the rpc label of HolderRPC.
const (
	RPCQueryBlocks  = "query_blocks_for_transfer"
	RPCReleaseLock  = "release_transfer_lock"
	RPCRenewLock    = "renew_transfer_lock"
	RPCHandshake    = "rdma_handshake"
	RPCDisconnect   = "rdma_disconnect"
	RPCForceRelease = "admin_release_lock"
)

// Fetch statuses used as the status label of FetchTotal.
const (
	FetchOK        = "ok"
	FetchError     = "error"
	FetchCanceled  = "canceled"
	FetchDiscarded = "discarded" // lock lapsed during the read; data dropped
	FetchPanic     = "panic"
	FetchMissing   = "missing" // nothing to fetch: peer had none of the blocks
)

// Metrics is the set of pegad's metrics. Create one per daemon (or per test)
// with New; every field is registered on the registerer given.
type Metrics struct {
	// Holder side.
	HolderRPC          *prometheus.CounterVec // rpc, code
	SessionsActive     prometheus.Gauge
	LockActive         prometheus.Gauge // blocks pinned by live sessions (counted per session)
	LockTimeouts       prometheus.Counter
	LockForceReleases  prometheus.Counter
	LockRenewals       prometheus.Counter
	IncarnationReclaim prometheus.Counter // sessions released because their requester restarted
	LockEndedNotLive   prometheus.Counter // releases that found the session already expired/reclaimed

	// Requester side.
	FetchTotal        *prometheus.CounterVec // status
	FetchBytes        prometheus.Counter
	FetchDuration     prometheus.Histogram
	FetchErrors       *prometheus.CounterVec // class (connection, local_resource, remote, deadline, invalid)
	GuardAborts       prometheus.Counter
	GuardReleaseFails prometheus.Counter
	RenewFailures     prometheus.Counter
	FetchesInFlight   prometheus.Gauge
	StagingQuarantine prometheus.Gauge // bytes held back until QPs are flushed

	// Connections and data plane.
	RDMAQPs         prometheus.Gauge
	SessionWorkers  prometheus.Gauge
	Conns           *prometheus.GaugeVec   // role, state
	Handshakes      *prometheus.CounterVec // role, result
	Invalidations   *prometheus.CounterVec // reason
	WorkCompletions *prometheus.CounterVec // status
	// Batches answered "session invalidated before batch execution".
	BatchesInvalidated prometheus.Counter
	// QPs destroyed because they did not drain after ERROR.
	QPDrainFailures prometheus.Counter
	// tcp provider: data connections dropped before or at their hello.
	TCPDataRefused *prometheus.CounterVec // reason
	// Holder-side connections torn down because their requester is gone
	// (idle, no data connection) or their drain time after a reconnect ran out.
	AcceptedReaped *prometheus.CounterVec // reason

	// Pool and store.
	PoolSize       prometheus.Gauge
	PoolUsed       prometheus.Gauge
	PoolLocked     prometheus.Gauge
	Blocks         prometheus.Gauge
	BlockBytes     prometheus.Gauge
	Evictions      prometheus.Counter
	PinnedDeferred prometheus.Gauge // evicted/deleted blocks whose memory waits for the last pin
}

// New creates and registers the metrics on reg. Go runtime and process
// collectors are registered too when runtime is true (daemon registries).
func New(reg prometheus.Registerer, runtime bool) *Metrics {
	m := &Metrics{
		HolderRPC: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pegaflow_holder_rpc_total", Help: "Holder-side peer RPCs by rpc and gRPC status code.",
		}, []string{"rpc", "code"}),
		SessionsActive: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "pegaflow_transfer_sessions_active", Help: "Live transfer sessions (locks) held on this node as holder.",
		}),
		LockActive: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "pegaflow_transfer_lock_active", Help: "Blocks pinned by live transfer sessions (a block pinned by two sessions counts twice).",
		}),
		LockTimeouts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "pegaflow_transfer_lock_timeouts_total", Help: "Transfer sessions expired (by the GC sweeper, or at a release or renewal after their deadline) before being released.",
		}),
		LockForceReleases: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "pegaflow_transfer_lock_force_releases_total", Help: "Transfer sessions force-released by an operator.",
		}),
		LockRenewals: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "pegaflow_transfer_lock_renewals_total", Help: "Successful transfer lock renewals.",
		}),
		IncarnationReclaim: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "pegaflow_transfer_lock_incarnation_reclaims_total", Help: "Transfer sessions released at once because their requester restarted.",
		}),
		LockEndedNotLive: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "pegaflow_transfer_lock_release_not_live_total", Help: "Releases that found their session already expired or reclaimed.",
		}),
		FetchTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pegaflow_rdma_fetch_total", Help: "Prefetches run as requester, by outcome.",
		}, []string{"status"}),
		FetchBytes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "pegaflow_rdma_fetch_bytes_total", Help: "Bytes fetched by RDMA READ and indexed locally.",
		}),
		FetchDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "pegaflow_rdma_fetch_duration_seconds", Help: "Prefetch duration, connect to release.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}),
		FetchErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pegaflow_rdma_fetch_errors_total", Help: "Failed prefetches by error class.",
		}, []string{"class"}),
		GuardAborts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "pegaflow_transfer_lock_guard_aborts_total", Help: "Transfer locks released by the guard on an abnormal exit (panic, cancellation, shutdown).",
		}),
		GuardReleaseFails: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "pegaflow_transfer_lock_guard_release_failures_total", Help: "Guard release RPCs that failed (the holder's GC reclaims those).",
		}),
		RenewFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "pegaflow_transfer_lock_renew_failures_total", Help: "Lock renewals the requester sent that the holder refused or that failed.",
		}),
		FetchesInFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "pegaflow_rdma_fetches_in_flight", Help: "Prefetches running now.",
		}),
		StagingQuarantine: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "pegaflow_rdma_staging_quarantined_bytes", Help: "Staging bytes held until the QPs that could write them are flushed.",
		}),
		RDMAQPs: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "pegaflow_rdma_qps", Help: "Active RC queue pairs (peers x NICs x qps_per_peer).",
		}),
		SessionWorkers: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "pegaflow_session_workers", Help: "Live QP session worker goroutines.",
		}),
		Conns: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "pegaflow_rdma_connections", Help: "Peer connections by role and state.",
		}, []string{"role", "state"}),
		Handshakes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pegaflow_rdma_handshakes_total", Help: "RDMA handshakes by role and result.",
		}, []string{"role", "result"}),
		Invalidations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pegaflow_rdma_connection_invalidations_total", Help: "Connections invalidated, by reason.",
		}, []string{"reason"}),
		WorkCompletions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pegaflow_rdma_work_completions_total", Help: "Work completions polled, by ibv_wc_status.",
		}, []string{"status"}),
		BatchesInvalidated: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "pegaflow_session_batches_invalidated_total", Help: "READ batches accepted by a QP session but answered 'session invalidated before batch execution'.",
		}),
		QPDrainFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "pegaflow_rdma_qp_drain_failures_total", Help: "QPs destroyed because their work requests did not drain after ERROR.",
		}),
		TCPDataRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pegaflow_tcp_data_conns_refused_total", Help: "tcp provider data connections dropped before or at their hello, by reason.",
		}, []string{"reason"}),
		AcceptedReaped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pegaflow_rdma_accepted_reaped_total", Help: "Holder-side connections torn down without a disconnect from their requester, by reason (idle, drained).",
		}, []string{"reason"}),
		PoolSize: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "pegaflow_pool_size_bytes", Help: "Size of the pinned host memory pool.",
		}),
		PoolUsed: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "pegaflow_pool_used_bytes", Help: "Pool bytes allocated (blocks, staging, pinned-but-evicted).",
		}),
		PoolLocked: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "pegaflow_pool_locked", Help: "1 when the pool is mlock'ed, 0 when mlock was not allowed.",
		}),
		Blocks: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "pegaflow_blocks", Help: "Blocks in the index.",
		}),
		BlockBytes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "pegaflow_block_bytes", Help: "Bytes of blocks in the index.",
		}),
		Evictions: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "pegaflow_block_evictions_total", Help: "Blocks evicted from the index by the LRU.",
		}),
		PinnedDeferred: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "pegaflow_blocks_deferred_free", Help: "Blocks out of the index whose memory waits for their last pin.",
		}),
	}
	reg.MustRegister(
		m.HolderRPC, m.SessionsActive, m.LockActive, m.LockTimeouts, m.LockForceReleases,
		m.LockRenewals, m.IncarnationReclaim, m.LockEndedNotLive,
		m.FetchTotal, m.FetchBytes, m.FetchDuration, m.FetchErrors, m.GuardAborts,
		m.GuardReleaseFails, m.RenewFailures, m.FetchesInFlight, m.StagingQuarantine,
		m.RDMAQPs, m.SessionWorkers, m.Conns, m.Handshakes, m.Invalidations, m.WorkCompletions,
		m.BatchesInvalidated, m.QPDrainFailures, m.TCPDataRefused, m.AcceptedReaped,
		m.PoolSize, m.PoolUsed, m.PoolLocked, m.Blocks, m.BlockBytes, m.Evictions, m.PinnedDeferred,
	)
	if runtime {
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	return m
}

// NewForTest returns metrics on a private registry.
func NewForTest() *Metrics { return New(prometheus.NewRegistry(), false) }

// Value reads the current value of a counter or gauge (0 for other kinds).
func Value(c prometheus.Metric) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		return 0
	}
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	}
	return 0
}
