// Package metrics defines every Prometheus metric pegad exports, under the
// names operators' dashboards depend on (see DESIGN.md "Contracts").
//
// It owns the metric definitions only; components update them. It must never
// hold references to components, so any package can import it.
package metrics

import (
	"sync"
	"sync/atomic"
	"time"

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
	RPCEndHandoff   = "end_handoff"
)

// RPCs is every rpc label of HolderRPC.
var RPCs = []string{RPCQueryBlocks, RPCReleaseLock, RPCRenewLock, RPCHandshake, RPCDisconnect, RPCForceRelease, RPCEndHandoff}

// grpcCodes are the code label values of HolderRPC (codes.Code.String()).
var grpcCodes = []string{"OK", "Canceled", "Unknown", "InvalidArgument", "DeadlineExceeded", "NotFound",
	"AlreadyExists", "PermissionDenied", "ResourceExhausted", "FailedPrecondition", "Aborted",
	"OutOfRange", "Unimplemented", "Internal", "Unavailable", "DataLoss", "Unauthenticated"}

// Session end outcomes, the outcome label of SessionEnds.
const (
	OutcomeReleased  = "released"  // by its requester
	OutcomeExpired   = "expired"   // by the sweeper, after lock-timeout
	OutcomeReclaimed = "reclaimed" // its requester restarted
	OutcomeForced    = "forced"    // by an operator, or by the holder's shutdown
	OutcomeAbandoned = "abandoned" // granted to a query whose caller had gone: the answer was never delivered
)

// Outcomes is every outcome label of SessionEnds.
var Outcomes = []string{OutcomeReleased, OutcomeExpired, OutcomeReclaimed, OutcomeForced, OutcomeAbandoned}

// Label values the components use, listed here so that every labelled
// series exists at zero from the first scrape (differences and rate()
// then work before anything happened). A value missing here only means
// its series appears on first use.
var (
	FetchStatuses     = []string{FetchOK, FetchError, FetchCanceled, FetchDiscarded, FetchPanic, FetchMissing}
	FetchErrorClasses = []string{"connection", "local_resource", "remote", "deadline", "invalid", "authentication"}
	ConnRoles         = []string{"requester", "holder"}
	ConnStates        = []string{"connecting", "connected", "invalidated"}
	HandshakeResults  = []string{"ok", "error", "invalid", "rejected", "unreachable", "rail_fault"}
	InvalidReasons    = []string{"manual", "shutdown", "deadline", "canceled", "completion_error",
		"session_invalidated", "connection_broken", "peer_restarted", "remote_memory", "other"}
	WCStatuses = []string{"success", "wr_flush_err", "rem_access_err", "loc_prot_err", "retry_exc_err",
		"rem_inv_req_err", "loc_len_err"}
	// TCPRefusedReasons: internal/ibv/tcp's refused* reasons.
	TCPRefusedReasons = []string{"source_limit", "total_limit", "bad_hello", "hello_timeout", "rejected"}
	// ReapReasons: internal/conn's reap* reasons.
	ReapReasons = []string{"idle", "drain_timeout"}
	// HalfOpenPorts: the port label of HalfOpenRefused, one per pegad
	// listener (internal/daemon); HalfOpenReasons: internal/netgate's
	// Reason* strings.
	HalfOpenPorts   = []string{PortPeer, PortLocal, PortData, PortMetrics, PortDebug}
	HalfOpenReasons = []string{"source_limit", "total_limit", "timeout"}
	// LocalLeaseEndReasons: internal/lease's Reason strings, and
	// LocalSpareExpired for an unused reservation (internal/localdata).
	LocalLeaseEndReasons = []string{"disconnected", "expired", "shutdown", LocalSpareExpired}
)

// Ports of HalfOpenRefused.
const (
	PortPeer    = "peer"    // --listen: peer gRPC
	PortLocal   = "local"   // --socket: local gRPC
	PortData    = "data"    // the data socket beside --socket
	PortMetrics = "metrics" // --metrics-listen
	PortDebug   = "debug"   // --debug-listen
)

// LocalSpareExpired is the pegaflow_local_lease_ends_total reason of a
// client's unused reservation that expired: an idle client, kept apart
// from "expired" so that one still signals a stuck client.
const LocalSpareExpired = "spare_expired"

// MaxRequesterLabels bounds the requester label of
// SessionsLiveByRequester: requesters past it share OtherRequester.
const (
	MaxRequesterLabels = 256
	OtherRequester     = "_other"
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
	SessionsGranted    prometheus.Counter // sessions opened (queries that locked at least one block)
	SessionEnds        *prometheus.CounterVec
	EmptyQueries       prometheus.Counter // queries that locked nothing
	// sessionsByReq is SessionsLiveByRequester's vector; use RequesterSessions.
	sessionsByReq *prometheus.GaugeVec
	reqMu         sync.Mutex          // guards reqLabels and reqOverflow
	reqLabels     map[string]struct{} // requester labels in use, bounded by MaxRequesterLabels
	reqOverflow   map[string]struct{} // requesters counted under OtherRequester until forgotten
	oldestAge     atomic.Pointer[func() time.Duration]
	poolParts     *poolParts

	// Requester side.
	FetchTotal        *prometheus.CounterVec // status
	FetchBytes        prometheus.Counter
	FetchDuration     prometheus.Histogram
	FetchErrors       *prometheus.CounterVec // class (connection, local_resource, remote, deadline, invalid, authentication)
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
	NICReadBytes    *prometheus.CounterVec // nic
	NICEvents       *prometheus.CounterVec // nic, event
	NICUp           *prometheus.GaugeVec   // nic
	MemoryWindows   *prometheus.GaugeVec   // nic
	WindowBinds     *prometheus.CounterVec // result
	// Batches answered "session invalidated before batch execution".
	BatchesInvalidated prometheus.Counter
	// QPs destroyed because they did not drain after ERROR.
	QPDrainFailures prometheus.Counter
	// tcp provider: data connections dropped before or at their hello.
	TCPDataRefused *prometheus.CounterVec // reason
	// Connections of pegad's ports dropped before their protocol's first
	// step (internal/netgate): evicted by a half-open limit, or too slow.
	HalfOpenRefused *prometheus.CounterVec // port, reason
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
	EvictedBytes   prometheus.Counter // bytes of evicted blocks
	EvictionWeight prometheus.Gauge   // prefix policy: the climber's frequency weight
	PinnedDeferred prometheus.Gauge   // evicted/deleted blocks whose memory waits for the last pin
	PoolPinned     prometheus.Gauge   // bytes of pinned blocks: what eviction cannot free
	// NamespaceQuota: the per-namespace quota series (quota.go).
	NamespaceQuota *Quota

	// Process (info.go): each under its name and its deprecated one.
	buildInfo     []*prometheus.GaugeVec
	transportInfo []*prometheus.GaugeVec

	// Peer-port protection (security.go).
	Security
}

// New creates and registers the metrics on reg. Go runtime and process
// collectors are registered too when runtime is true (daemon registries).
func New(reg prometheus.Registerer, runtime bool) *Metrics {
	m := &Metrics{poolParts: newPoolParts()}
	reg.MustRegister(m.poolParts)
	m.registerHolder(reg)
	m.registerRequester(reg)
	m.registerConns(reg)
	m.registerPool(reg)
	m.NamespaceQuota = newQuota(reg)
	m.registerProcess(reg)
	m.Security = newSecurity(reg)
	m.initSeries()
	if runtime {
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	return m
}

// registerHolder creates and registers the metrics of the holder side: transfer sessions (locks) and peer RPCs.
func (m *Metrics) registerHolder(reg prometheus.Registerer) {
	m.HolderRPC = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "pegaflow_holder_rpc_total", Help: "Holder-side peer RPCs by rpc and gRPC status code.",
	}, []string{"rpc", "code"})
	m.SessionsActive = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "pegaflow_transfer_sessions_active", Help: "Live transfer sessions (locks) held on this node as holder.",
	})
	m.LockActive = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "pegaflow_transfer_lock_active", Help: "Locked blocks: block pins held by live transfer sessions (a block locked by two sessions counts twice); not a count of locks, see pegaflow_transfer_sessions_active.",
	})
	m.LockTimeouts = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "pegaflow_transfer_lock_timeouts_total", Help: "Transfer sessions expired (by the GC sweeper, or at a release or renewal after their deadline) before being released.",
	})
	m.LockForceReleases = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "pegaflow_transfer_lock_force_releases_total", Help: "Transfer sessions force-released by an operator.",
	})
	m.LockRenewals = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "pegaflow_transfer_lock_renewals_total", Help: "Successful transfer lock renewals.",
	})
	m.IncarnationReclaim = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "pegaflow_transfer_lock_incarnation_reclaims_total", Help: "Transfer sessions released at once because their requester restarted.",
	})
	m.LockEndedNotLive = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "pegaflow_transfer_lock_release_not_live_total", Help: "Releases that found their session already expired or reclaimed.",
	})
	m.SessionsGranted = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "pegaflow_holder_sessions_granted_total", Help: "Transfer sessions (locks) granted by this holder; granted minus ended is the live count.",
	})
	m.SessionEnds = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "pegaflow_holder_session_ends_total", Help: "Transfer sessions ended, by outcome (released, expired, reclaimed, forced, abandoned).",
	}, []string{"outcome"})
	m.EmptyQueries = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "pegaflow_holder_empty_queries_total", Help: "Block queries that locked nothing (no block found); no session was granted.",
	})
	m.sessionsByReq = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "pegaflow_holder_sessions_live_by_requester", Help: "Live transfer sessions held here, by requester node (at most 256 nodes; more share requester=\"_other\").",
	}, []string{"requester"})
	m.reqLabels = make(map[string]struct{})
	m.reqOverflow = make(map[string]struct{})
	reg.MustRegister(
		m.HolderRPC, m.SessionsActive, m.LockActive, m.LockTimeouts, m.LockForceReleases, m.LockRenewals,
		m.IncarnationReclaim, m.LockEndedNotLive, m.SessionsGranted, m.SessionEnds, m.EmptyQueries,
		m.sessionsByReq,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "pegaflow_holder_oldest_session_age_seconds",
			Help: "Age of the oldest live transfer session held here (0 when none): a leaked lock shows as a steady rise.",
		}, m.oldestSessionAge),
	)
}

// registerRequester creates and registers the metrics of the requester side: prefetches and their locks.
func (m *Metrics) registerRequester(reg prometheus.Registerer) {
	m.FetchTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "pegaflow_rdma_fetch_total", Help: "Prefetches run as requester, by outcome.",
	}, []string{"status"})
	m.FetchBytes = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "pegaflow_rdma_fetch_bytes_total", Help: "Bytes read from peers by RDMA READ as requester, counted as each READ completes (reads a fetch later discards included).",
	})
	m.FetchDuration = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "pegaflow_rdma_fetch_duration_seconds", Help: "Prefetch duration, connect to release.",
		Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
	})
	m.FetchErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "pegaflow_rdma_fetch_errors_total", Help: "Failed prefetches by error class.",
	}, []string{"class"})
	m.GuardAborts = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "pegaflow_transfer_lock_guard_aborts_total", Help: "Transfer locks released by the guard on an abnormal exit (panic, cancellation, shutdown).",
	})
	m.GuardReleaseFails = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "pegaflow_transfer_lock_guard_release_failures_total", Help: "Guard release RPCs that failed (the holder's GC reclaims those).",
	})
	m.RenewFailures = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "pegaflow_transfer_lock_renew_failures_total", Help: "Lock renewals the requester sent that the holder refused or that failed.",
	})
	m.FetchesInFlight = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "pegaflow_rdma_fetches_in_flight", Help: "Prefetches running now.",
	})
	m.StagingQuarantine = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "pegaflow_rdma_staging_quarantined_bytes", Help: "Staging bytes held until the QPs that could write them are flushed.",
	})
	reg.MustRegister(
		m.FetchTotal, m.FetchBytes, m.FetchDuration, m.FetchErrors, m.GuardAborts, m.GuardReleaseFails,
		m.RenewFailures, m.FetchesInFlight, m.StagingQuarantine,
	)
}

// registerConns creates and registers the metrics of peer connections and the data plane.
func (m *Metrics) registerConns(reg prometheus.Registerer) {
	m.RDMAQPs = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "pegaflow_rdma_qps", Help: "Active RC queue pairs (peers x NICs x qps_per_peer).",
	})
	m.SessionWorkers = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "pegaflow_session_workers", Help: "Live QP session worker goroutines.",
	})
	m.Conns = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "pegaflow_rdma_connections", Help: "Peer connections by role and state.",
	}, []string{"role", "state"})
	m.Handshakes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "pegaflow_rdma_handshakes_total", Help: "RDMA handshakes by role and result.",
	}, []string{"role", "result"})
	m.Invalidations = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "pegaflow_rdma_connection_invalidations_total", Help: "Connections invalidated, by reason.",
	}, []string{"reason"})
	m.NICReadBytes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "pegaflow_rdma_nic_read_bytes_total", Help: "Bytes of RDMA READs issued through each local NIC.",
	}, []string{"nic"})
	m.NICEvents = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "pegaflow_rdma_nic_events_total", Help: "Asynchronous port events of each local NIC (port_down, port_up, address_change).",
	}, []string{"nic", "event"})
	m.NICUp = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "pegaflow_rdma_nic_up", Help: "1 while a local NIC's port is ACTIVE and the NIC carries READs, 0 while it is down (out of placement).",
	}, []string{"nic"})
	m.MemoryWindows = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "pegaflow_rdma_memory_windows", Help: "Memory windows bound for live transfer locks (--memory-windows), per local NIC.",
	}, []string{"nic"})
	m.WindowBinds = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "pegaflow_rdma_window_binds_total", Help: "Transfer locks whose memory windows were bound (ok) or could not be (error: the lock was refused).",
	}, []string{"result"})
	m.WorkCompletions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "pegaflow_rdma_work_completions_total", Help: "Work completions polled, by ibv_wc_status.",
	}, []string{"status"})
	m.BatchesInvalidated = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "pegaflow_session_batches_invalidated_total", Help: "READ batches accepted by a QP session but answered 'session invalidated before batch execution'.",
	})
	m.QPDrainFailures = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "pegaflow_rdma_qp_drain_failures_total", Help: "QPs destroyed because their work requests did not drain after ERROR.",
	})
	m.TCPDataRefused = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "pegaflow_tcp_data_conns_refused_total", Help: "tcp provider data connections dropped before or at their hello, by reason.",
	}, []string{"reason"})
	m.HalfOpenRefused = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "pegaflow_half_open_conns_refused_total", Help: "Connections to pegad's ports closed before they completed their protocol's first step (hello, HTTP/2 preface, request header, TLS handshake), by port and reason (source_limit, total_limit: evicted by the half-open limits; timeout).",
	}, []string{"port", "reason"})
	m.AcceptedReaped = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "pegaflow_rdma_accepted_reaped_total", Help: "Holder-side connections torn down without a disconnect from their requester, by reason (idle, drained).",
	}, []string{"reason"})
	reg.MustRegister(
		m.RDMAQPs, m.SessionWorkers, m.Conns, m.Handshakes, m.Invalidations, m.NICReadBytes, m.NICEvents, m.NICUp,
		m.MemoryWindows, m.WindowBinds, m.WorkCompletions, m.BatchesInvalidated, m.QPDrainFailures, m.TCPDataRefused, m.AcceptedReaped,
		m.HalfOpenRefused,
	)
}

// registerPool creates and registers the metrics of the pool and the block store.
func (m *Metrics) registerPool(reg prometheus.Registerer) {
	m.PoolSize = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "pegaflow_pool_size_bytes", Help: "Size of the pinned host memory pool.",
	})
	m.PoolUsed = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "pegaflow_pool_used_bytes", Help: "Pool bytes allocated (blocks, staging, pinned-but-evicted).",
	})
	m.PoolLocked = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "pegaflow_pool_locked", Help: "1 when the pool is mlock'ed, 0 when mlock was not allowed.",
	})
	m.Blocks = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "pegaflow_blocks", Help: "Blocks in the index.",
	})
	m.BlockBytes = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "pegaflow_block_bytes", Help: "Bytes of blocks in the index.",
	})
	m.Evictions = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "pegaflow_block_evictions_total", Help: "Blocks evicted from the index by the eviction policy (--eviction).",
	})
	m.EvictedBytes = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "pegaflow_block_evicted_bytes_total", Help: "Bytes of the blocks evicted; over the bytes the evicting allocations asked for, the fragmentation cost of the policy.",
	})
	m.EvictionWeight = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "pegaflow_eviction_frequency_weight", Help: "Prefix eviction policy: the frequency weight its hill climber holds (× resident blocks; 0: recency alone). 0 under lru.",
	})
	m.PinnedDeferred = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "pegaflow_blocks_deferred_free", Help: "Blocks out of the index whose memory waits for their last pin.",
	})
	m.PoolPinned = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "pegaflow_pool_pinned_bytes", Help: "Bytes of blocks pinned by a transfer lock or a local read: pool memory eviction cannot free.",
	})
	reg.MustRegister(
		m.PoolSize, m.PoolUsed, m.PoolLocked, m.Blocks, m.BlockBytes, m.Evictions, m.PinnedDeferred,
		m.PoolPinned, m.EvictedBytes, m.EvictionWeight,
	)
}

// initSeries creates every known labelled series at zero.
func (m *Metrics) initSeries() {
	for _, rpc := range RPCs {
		for _, c := range grpcCodes {
			m.HolderRPC.WithLabelValues(rpc, c)
		}
	}
	for _, o := range Outcomes {
		m.SessionEnds.WithLabelValues(o)
	}
	for _, s := range FetchStatuses {
		m.FetchTotal.WithLabelValues(s)
	}
	for _, c := range FetchErrorClasses {
		m.FetchErrors.WithLabelValues(c)
	}
	for _, r := range ConnRoles {
		for _, s := range ConnStates {
			m.Conns.WithLabelValues(r, s)
		}
		for _, res := range HandshakeResults {
			m.Handshakes.WithLabelValues(r, res)
		}
	}
	for _, r := range InvalidReasons {
		m.Invalidations.WithLabelValues(r)
	}
	for _, s := range WCStatuses {
		m.WorkCompletions.WithLabelValues(s)
	}
	for _, r := range TCPRefusedReasons {
		m.TCPDataRefused.WithLabelValues(r)
	}
	for _, r := range ReapReasons {
		m.AcceptedReaped.WithLabelValues(r)
	}
	for _, p := range HalfOpenPorts {
		for _, r := range HalfOpenReasons {
			m.HalfOpenRefused.WithLabelValues(p, r)
		}
	}
}

// RequesterSessions is the live-sessions gauge of requester node id. The
// label set is bounded: past MaxRequesterLabels distinct nodes, new ones
// share OtherRequester.
func (m *Metrics) RequesterSessions(id string) prometheus.Gauge {
	m.reqMu.Lock()
	defer m.reqMu.Unlock()
	// A node stays under the label it got first until it is forgotten, so
	// that its decrements meet its increments.
	if _, ok := m.reqOverflow[id]; ok || id == OtherRequester {
		return m.sessionsByReq.WithLabelValues(OtherRequester)
	}
	if _, ok := m.reqLabels[id]; !ok {
		if len(m.reqLabels) >= MaxRequesterLabels {
			m.reqOverflow[id] = struct{}{}
			return m.sessionsByReq.WithLabelValues(OtherRequester)
		}
		m.reqLabels[id] = struct{}{}
	}
	return m.sessionsByReq.WithLabelValues(id)
}

// ForgetRequester drops requester id's series (the holder forgot the
// node: it holds nothing and was idle), freeing its label slot.
func (m *Metrics) ForgetRequester(id string) {
	m.reqMu.Lock()
	defer m.reqMu.Unlock()
	delete(m.reqOverflow, id)
	if _, ok := m.reqLabels[id]; ok {
		delete(m.reqLabels, id)
		m.sessionsByReq.DeleteLabelValues(id)
	}
}

// SetOldestSessionAge installs the function read at each scrape for the
// oldest live session's age (the holder's lock table).
func (m *Metrics) SetOldestSessionAge(f func() time.Duration) { m.oldestAge.Store(&f) }

func (m *Metrics) oldestSessionAge() float64 {
	if f := m.oldestAge.Load(); f != nil {
		return (*f)().Seconds()
	}
	return 0
}

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
