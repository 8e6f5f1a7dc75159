package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Reasons of PeerAuthRefused.
const (
	AuthTLSHandshake    = "tls_handshake"     // no client certificate, an unknown CA, plaintext
	AuthNotAllowed      = "not_allowed"       // verified certificate off --peer-allow
	AuthIdentityClaimed = "identity_mismatch" // claimed node id is not one of the certificate's names
)

// Limits named by PeerLimitRefused and in RESOURCE_EXHAUSTED messages.
const (
	LimitSessionsPerPeer    = "max-sessions-per-peer"
	LimitPinnedBytesPerPeer = "max-pinned-bytes-per-peer"
	LimitPinnedBytesNode    = "max-pinned-bytes"
)

// Security is the peer-port protection metrics (issue 10): who was
// refused and why, the node certificate's expiry, and the limits.
type Security struct {
	PeerAuthRefused  *prometheus.CounterVec // reason
	PeerCertExpiry   prometheus.Gauge       // unix seconds of the node certificate's NotAfter
	PeerTLSReloads   *prometheus.CounterVec // result (ok, error)
	PeerLimitRefused *prometheus.CounterVec // limit
	PeerPinnedBytes  prometheus.Gauge       // bytes pinned by live sessions of all peers
	// PeerQuarantined: bytes of quarantined locks (holder/quarantine.go),
	// pinned until the process ends.
	PeerQuarantined   prometheus.Gauge
	PeerLimitSettings *prometheus.GaugeVec // limit: the configured value
}

func newSecurity(reg prometheus.Registerer) Security {
	s := Security{
		PeerAuthRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pegaflow_peer_auth_refused_total", Help: "Peer-port connections or calls refused, by reason (tls_handshake, not_allowed, identity_mismatch).",
		}, []string{"reason"}),
		PeerCertExpiry: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "pegaflow_peer_tls_cert_expiry_timestamp_seconds", Help: "NotAfter of the node certificate in use on the peer port (unix seconds; 0 without TLS).",
		}),
		PeerTLSReloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pegaflow_peer_tls_reloads_total", Help: "Reloads of the peer TLS files (SIGHUP), by result (ok, error: the old files stay in use).",
		}, []string{"result"}),
		PeerLimitRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pegaflow_peer_limit_refused_total", Help: "Transfer lock queries and renewals refused with RESOURCE_EXHAUSTED, by limit.",
		}, []string{"limit"}),
		PeerPinnedBytes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "pegaflow_peer_pinned_bytes", Help: "Bytes pinned by live transfer sessions of all peers (a block pinned by two sessions counts twice).",
		}),
		PeerQuarantined: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "pegaflow_peer_quarantined_bytes", Help: "Bytes of transfer locks quarantined because their memory windows could not be invalidated: pinned until pegad restarts.",
		}),
		PeerLimitSettings: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "pegaflow_peer_limit", Help: "Configured per-peer and node-wide limits, by limit (0: unlimited).",
		}, []string{"limit"}),
	}
	reg.MustRegister(s.PeerAuthRefused, s.PeerCertExpiry, s.PeerTLSReloads, s.PeerLimitRefused,
		s.PeerPinnedBytes, s.PeerQuarantined, s.PeerLimitSettings)
	// Every series exists from the start at 0, so rate() and alerts see
	// the first refusal.
	for _, r := range []string{AuthTLSHandshake, AuthNotAllowed, AuthIdentityClaimed} {
		s.PeerAuthRefused.WithLabelValues(r)
	}
	for _, r := range []string{"ok", "error"} {
		s.PeerTLSReloads.WithLabelValues(r)
	}
	for _, l := range []string{LimitSessionsPerPeer, LimitPinnedBytesPerPeer, LimitPinnedBytesNode} {
		s.PeerLimitRefused.WithLabelValues(l)
	}
	return s
}

// PeerTLS is the recorder the peer port's TLS source (peertls.Recorder)
// counts into: the certificate's expiry, reloads and refusals.
func (s *Security) PeerTLS() PeerTLS { return PeerTLS{s: s} }

// PeerTLS records peertls's events into Security's metrics.
type PeerTLS struct{ s *Security }

// CertInstalled sets the node certificate's expiry gauge.
func (p PeerTLS) CertInstalled(notAfter time.Time) {
	p.s.PeerCertExpiry.Set(float64(notAfter.Unix()))
}

// Reloaded counts a reload of the TLS files by result.
func (p PeerTLS) Reloaded(ok bool) {
	r := "error"
	if ok {
		r = "ok"
	}
	p.s.PeerTLSReloads.WithLabelValues(r).Inc()
}

// Refused counts a refused peer by reason.
func (p PeerTLS) Refused(reason string) { p.s.PeerAuthRefused.WithLabelValues(reason).Inc() }
