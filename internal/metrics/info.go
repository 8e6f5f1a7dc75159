package metrics

import "github.com/prometheus/client_golang/prometheus"

// The info metrics say which build and which data transport run. They
// were pegad_build_info and pegad_transport_info, the only families
// outside pegaflow_*; they are now pegaflow_* like every other. The old
// names are still exported, with the same series, for one release, so
// that dashboards and alerts written against them keep working while
// they move: remove them in the release after the one that renamed them
// (the README's metric table and docs/operations.md say so).

// Deprecated maps each deprecated family to the one that replaces it.
var Deprecated = map[string]string{
	"pegad_build_info":     "pegaflow_build_info",
	"pegad_transport_info": "pegaflow_transport_info",
}

const (
	buildInfoHelp     = "Always 1; the labels say which build runs."
	transportInfoHelp = "Always 1; the labels say which data transport runs and why (requested, auto, fallback: verbs unavailable)."
)

// infoVecs makes the family name and, under its deprecated name, its
// copy.
func infoVecs(name, help string, labels ...string) []*prometheus.GaugeVec {
	vecs := []*prometheus.GaugeVec{prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, labels)}
	for old, now := range Deprecated {
		if now == name {
			vecs = append(vecs, prometheus.NewGaugeVec(prometheus.GaugeOpts{
				Name: old, Help: "Deprecated: use " + now + " (the same series); removed in the next release. " + help,
			}, labels))
		}
	}
	return vecs
}

// registerProcess creates and registers the metrics of which build and
// transport run.
func (m *Metrics) registerProcess(reg prometheus.Registerer) {
	m.buildInfo = infoVecs("pegaflow_build_info", buildInfoHelp, "version", "commit", "goversion")
	m.transportInfo = infoVecs("pegaflow_transport_info", transportInfoHelp, "transport", "reason")
	for _, v := range append(append([]*prometheus.GaugeVec{}, m.buildInfo...), m.transportInfo...) {
		reg.MustRegister(v)
	}
}

// setInfo makes labels the one series of every name of an info family.
func setInfo(vecs []*prometheus.GaugeVec, labels ...string) {
	for _, v := range vecs {
		v.Reset()
		v.WithLabelValues(labels...).Set(1)
	}
}

// SetBuildInfo sets pegaflow_build_info's one series.
func (m *Metrics) SetBuildInfo(version, commit, goversion string) {
	setInfo(m.buildInfo, version, commit, goversion)
}

// Transport reasons, the reason label of pegaflow_transport_info.
const (
	TransportRequested = "requested" // --transport named it
	TransportAuto      = "auto"      // --transport auto found verbs devices
	TransportFallback  = "fallback"  // --transport auto: verbs unavailable, tcp instead
)

// SetTransport sets pegaflow_transport_info's one series.
func (m *Metrics) SetTransport(transport, reason string) {
	setInfo(m.transportInfo, transport, reason)
}
