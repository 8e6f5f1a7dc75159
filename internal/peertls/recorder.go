package peertls

import "time"

// Reasons a peer is refused, as Recorder.Refused and the refusal log lines
// name them; they are the values of metrics' AuthTLSHandshake and
// AuthNotAllowed (the reason label), which TestReasonsAreMetricLabels checks.
const (
	ReasonTLSHandshake = "tls_handshake" // no client certificate, an unknown CA, plaintext
	ReasonNotAllowed   = "not_allowed"   // verified certificate off --peer-allow
)

// Recorder is what a Source counts: the daemon passes its metrics
// (metrics.Security.PeerTLS), so that peertls itself, and pegactl which
// uses its client side, carry no metrics library.
type Recorder interface {
	// CertInstalled: the node certificate now in use expires at notAfter.
	CertInstalled(notAfter time.Time)
	// Reloaded: a reload of the files succeeded (ok) or failed.
	Reloaded(ok bool)
	// Refused: a peer was refused for reason (ReasonTLSHandshake, ...).
	Refused(reason string)
}

// nopRecorder counts nothing (Options.Metrics nil: pegactl, tests).
type nopRecorder struct{}

func (nopRecorder) CertInstalled(time.Time) {}
func (nopRecorder) Reloaded(bool)           {}
func (nopRecorder) Refused(string)          {}
