package kubernetes

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"github.com/spf13/pflag"
	"helm.sh/helm/v4/pkg/chart/common"
	"helm.sh/helm/v4/pkg/chart/common/util"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	"helm.sh/helm/v4/pkg/engine"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"

	"github.com/pegaflow/pegad/internal/config"
)

const (
	chartDir = "../helm/pegad"
	// manifests holds the objects every cluster has the API of;
	// monitoringManifests the Prometheus Operator's (their CRDs must be
	// installed first).
	manifests           = "pegad.yaml"
	monitoringManifests = "pegad-monitoring.yaml"
	engineFile          = "examples/vllm.yaml"
	alertsFile          = "../prometheus/alerts.yaml"
	// vendoredAlerts is the chart's copy of alertsFile, so that the chart
	// works when copied alone.
	vendoredAlerts = chartDir + "/files/alerts.yaml"
	releaseName    = "pegad"
	namespace      = "pegad"
)

// TestMain quiets Helm's loader, which logs at INFO (on links in the
// chart, say).
func TestMain(m *testing.M) {
	slog.SetDefault(slog.New(slog.NewTextHandler(io.Discard, nil)))
	os.Exit(m.Run())
}

// variants are the value sets the chart is rendered and checked with.
var variants = []struct {
	name   string
	values string
}{
	{"defaults", ""},
	{"pod network, KV events, ServiceMonitor", `
hostNetwork: false
kvEvents: {enabled: true, port: 6557, replayPort: 6558}
monitoring:
  podMonitor: {enabled: false}
  serviceMonitor: {enabled: true}
ports: {peer: 7055, metrics: 7464}
`},
	{"peer TLS with SIGHUP reload, Redis from a secret, 1Gi huge pages", `
peerTLS: {enabled: true, allow: "spiffe://fleet/*"}
redis: {existingSecret: pegad-redis}
hugepages: {enabled: true, size: 1Gi, amount: 32Gi}
memory: 4Gi
config: {pool-size: 32GiB, shutdown-timeout: 120s}
terminationGracePeriodSeconds: 150
livenessFailureThreshold: 15
`},
	{"peer TLS restarted by Reloader, Redis URL, SR-IOV, tcp only", `
peerTLS: {enabled: true, reload: restart}
redis: {url: "redis://redis.pegad:6379"}
rdma: {resourceName: nvidia.com/mlnx_sriov_rdma, count: 2}
config: {transport: tcp, nics: "2"}
socket: {hostDir: /var/run/kv, group: "3000"}
`},
}

// render renders the chart as `helm template` would, for values in YAML.
func render(t *testing.T, values string) map[string]string {
	t.Helper()
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	vals := map[string]any{}
	if err := yaml.Unmarshal([]byte(values), &vals); err != nil {
		t.Fatal(err)
	}
	rv, err := util.ToRenderValues(ch, vals, common.ReleaseOptions{Name: releaseName, Namespace: namespace, IsInstall: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	out, err := engine.Render(ch, rv)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// objects of one render, decoded strictly.
type objects struct {
	ds       *appsv1.DaemonSet
	cm       *corev1.ConfigMap
	svc      *corev1.Service
	pm       *monitoringv1.PodMonitor
	sm       *monitoringv1.ServiceMonitor
	rule     *monitoringv1.PrometheusRule
	docs     []string // every YAML document, in file then document order
	kinds    []string
	filesOut map[string]string
}

// strict decodes one YAML document into out: an unknown field is an error.
func strict(doc string, out any) error {
	j, err := yaml.YAMLToJSON([]byte(doc))
	if err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(j))
	dec.DisallowUnknownFields()
	return dec.Decode(out)
}

var docSep = regexp.MustCompile(`(?m)^---\s*$`)

// varRef is what the kubelet reads as a variable reference: "$(" up to
// the next ")"; a shell's $(cmd) is one too, unless written $$(.
var varRef = regexp.MustCompile(`\$\(([^)]*)\)`)

// splitDocs returns the non-empty YAML documents of a file.
func splitDocs(s string) []string {
	var docs []string
	for _, d := range docSep.Split(s, -1) {
		empty := true
		for _, l := range strings.Split(d, "\n") {
			if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
				empty = false
				break
			}
		}
		if !empty {
			docs = append(docs, d)
		}
	}
	return docs
}

// decode decodes every rendered object strictly into its API type.
func decode(t *testing.T, files map[string]string) *objects {
	t.Helper()
	o := &objects{filesOut: files}
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if strings.HasSuffix(n, "NOTES.txt") {
			continue
		}
		for _, doc := range splitDocs(files[n]) {
			var tm metav1.TypeMeta
			if err := yaml.Unmarshal([]byte(doc), &tm); err != nil {
				t.Fatalf("%s: %v", n, err)
			}
			var err error
			switch k := tm.APIVersion + "/" + tm.Kind; k {
			case "apps/v1/DaemonSet":
				o.ds = &appsv1.DaemonSet{}
				err = strict(doc, o.ds)
			case "v1/ConfigMap":
				o.cm = &corev1.ConfigMap{}
				err = strict(doc, o.cm)
			case "v1/Service":
				o.svc = &corev1.Service{}
				err = strict(doc, o.svc)
			case "monitoring.coreos.com/v1/PodMonitor":
				o.pm = &monitoringv1.PodMonitor{}
				err = strict(doc, o.pm)
			case "monitoring.coreos.com/v1/ServiceMonitor":
				o.sm = &monitoringv1.ServiceMonitor{}
				err = strict(doc, o.sm)
			case "monitoring.coreos.com/v1/PrometheusRule":
				o.rule = &monitoringv1.PrometheusRule{}
				err = strict(doc, o.rule)
			default:
				t.Fatalf("%s: unexpected object %s", n, k)
			}
			if err != nil {
				t.Fatalf("%s: %s does not decode strictly: %v", n, tm.Kind, err)
			}
			o.docs = append(o.docs, doc)
			o.kinds = append(o.kinds, tm.Kind)
		}
	}
	if o.ds == nil || o.cm == nil {
		t.Fatalf("render has no DaemonSet or ConfigMap: %v", o.kinds)
	}
	return o
}

// podEnv is the pod's environment as the kubelet builds it: downward API
// fields and secrets given example values, $(VAR) references expanded.
func podEnv(c corev1.Container) ([]string, error) {
	vals := map[string]string{}
	var env []string
	for _, e := range c.Env {
		v := e.Value
		switch {
		case e.ValueFrom == nil:
		case e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "spec.nodeName":
			v = "gpu-node-7"
		case e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "status.podIP":
			v = "10.1.2.3"
		case e.ValueFrom.SecretKeyRef != nil:
			v = "redis://:secret@redis.pegad:6379"
		default:
			return nil, fmt.Errorf("env %s: unexpected source %+v", e.Name, e.ValueFrom)
		}
		for k, kv := range vals {
			v = strings.ReplaceAll(v, "$("+k+")", kv)
		}
		if strings.Contains(v, "$(") {
			return nil, fmt.Errorf("env %s: %q refers to a variable not defined before it", e.Name, v)
		}
		vals[e.Name] = v
		env = append(env, e.Name+"="+v)
	}
	return env, nil
}

func portOf(addr string) int {
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		return -1
	}
	n, _ := strconv.Atoi(p)
	return n
}

// pegadConfig loads the pod's pegad configuration with pegad's own code:
// the flags it passes (every one must exist in `pegad serve`), its PEGAD_*
// environment (every one a setting) and the ConfigMap's file where the
// pod mounts it (unknown keys and invalid values are errors).
func pegadConfig(t *testing.T, o *objects, c corev1.Container) (config.Config, []string) {
	t.Helper()
	var errs []string
	if len(c.Args) == 0 || c.Args[0] != "serve" {
		return config.Config{}, []string{fmt.Sprintf("pegad container args %q do not start with serve", c.Args)}
	}
	fs := pflag.NewFlagSet("pegad serve", pflag.ContinueOnError)
	fs.SetOutput(new(bytes.Buffer))
	config.RegisterFlags(fs, config.Default())
	if err := fs.Parse(c.Args[1:]); err != nil {
		return config.Config{}, []string{fmt.Sprintf("pegad serve refuses the pod's flags %q: %v", c.Args[1:], err)}
	}
	if fs.NArg() > 0 {
		errs = append(errs, fmt.Sprintf("pegad serve takes no arguments; the pod passes %q", fs.Args()))
	}
	// --config must name the ConfigMap's key where the pod mounts it.
	cfgPath, _ := fs.GetString(config.FlagConfig)
	mounted := false
	for _, m := range c.VolumeMounts {
		for _, v := range o.ds.Spec.Template.Spec.Volumes {
			if v.Name == m.Name && v.ConfigMap != nil && v.ConfigMap.Name == o.cm.Name {
				if _, ok := o.cm.Data[strings.TrimPrefix(cfgPath, m.MountPath+"/")]; ok && strings.HasPrefix(cfgPath, m.MountPath+"/") {
					mounted = true
				}
			}
		}
	}
	if !mounted {
		errs = append(errs, fmt.Sprintf("--config=%s is not a key of ConfigMap %s where the pod mounts it", cfgPath, o.cm.Name))
	}
	file := filepath.Join(t.TempDir(), "pegad.yaml")
	if err := os.WriteFile(file, []byte(o.cm.Data[filepath.Base(cfgPath)]), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := fs.Set(config.FlagConfig, file); err != nil {
		t.Fatal(err)
	}
	env, err := podEnv(c)
	if err != nil {
		return config.Config{}, append(errs, err.Error())
	}
	if unknown := config.UnknownEnv(env); len(unknown) > 0 {
		errs = append(errs, fmt.Sprintf("the pod sets PEGAD_* variables that are no setting: %v", unknown))
	}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, config.EnvPrefix+"_") {
			t.Setenv(k, v)
		}
	}
	cfg, err := config.Load(fs, config.Default())
	if err != nil {
		return cfg, append(errs, fmt.Sprintf("pegad refuses the pod's configuration: %v", err))
	}
	return cfg, errs
}

// container returns the named container of the DaemonSet's pod.
func container(o *objects, name string) *corev1.Container {
	for i := range o.ds.Spec.Template.Spec.Containers {
		if c := &o.ds.Spec.Template.Spec.Containers[i]; c.Name == name {
			return c
		}
	}
	return nil
}

// namedPort resolves a probe's port (a number or a container port's name).
func namedPort(c *corev1.Container, p any) int {
	switch v := p.(type) {
	case int32:
		return int(v)
	case *string:
		if v != nil {
			return namedPort(c, *v)
		}
	case string:
		for _, cp := range c.Ports {
			if cp.Name == v {
				return int(cp.ContainerPort)
			}
		}
	}
	return -1
}

// check returns every broken invariant of one render.
func check(t *testing.T, o *objects) []string {
	t.Helper()
	spec := o.ds.Spec.Template.Spec
	c := container(o, "pegad")
	if c == nil {
		return []string{"no pegad container"}
	}
	cfg, errs := pegadConfig(t, o, *c)
	if len(errs) > 0 {
		return errs
	}
	bad := func(format string, a ...any) { errs = append(errs, fmt.Sprintf(format, a...)) }

	// Drain: SIGKILL and the liveness probe wait longer than the drain.
	drain := cfg.ShutdownTimeout
	if g := spec.TerminationGracePeriodSeconds; g == nil || time.Duration(*g)*time.Second <= drain {
		bad("terminationGracePeriodSeconds %v is not above shutdown-timeout %s", g, drain)
	}
	lp := c.LivenessProbe
	if lp == nil {
		bad("no liveness probe")
	} else if d := time.Duration(lp.PeriodSeconds*lp.FailureThreshold) * time.Second; d <= drain {
		bad("the liveness probe kills after %s, within shutdown-timeout %s (health is NOT_SERVING while draining)", d, drain)
	}

	// Probes: /healthz on the metrics port, gRPC health on the peer port.
	metricsPort, peerPort := portOf(cfg.MetricsListen), portOf(cfg.Listen)
	for name, p := range map[string]*corev1.Probe{"startup": c.StartupProbe, "readiness": c.ReadinessProbe} {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/healthz" {
			bad("%s probe is not GET /healthz: %+v", name, p)
			continue
		}
		if got := probePort(c, p.HTTPGet.Port); got != metricsPort {
			bad("%s probe port %s is %d; metrics-listen is %s", name, p.HTTPGet.Port.String(), got, cfg.MetricsListen)
		}
	}
	if lp != nil {
		switch {
		case lp.GRPC != nil:
			if int(lp.GRPC.Port) != peerPort {
				bad("liveness gRPC health on port %d; listen is %s", lp.GRPC.Port, cfg.Listen)
			}
			if cfg.PeerTLSCert != "" {
				bad("liveness uses gRPC on a peer port that requires client certificates")
			}
		case lp.HTTPGet != nil:
			if lp.HTTPGet.Path != "/healthz" || probePort(c, lp.HTTPGet.Port) != metricsPort {
				bad("liveness GET %s on %v; want /healthz on %d", lp.HTTPGet.Path, lp.HTTPGet.Port, metricsPort)
			}
		default:
			bad("liveness probe is neither gRPC health nor /healthz")
		}
	}

	// Ports: every port pegad serves is declared, at the configured number.
	want := map[string]int{"peer": peerPort, "metrics": metricsPort}
	if cfg.KVEventsEndpoint != "" {
		want["kv-events"] = portOf(strings.TrimPrefix(cfg.KVEventsEndpoint, "tcp://"))
	}
	if cfg.KVEventsReplayEndpoint != "" {
		want["kv-replay"] = portOf(strings.TrimPrefix(cfg.KVEventsReplayEndpoint, "tcp://"))
	}
	for name, p := range want {
		if got := namedPort(c, name); got != p {
			bad("container port %s is %d; pegad serves it on %d", name, got, p)
		}
	}
	if !strings.HasSuffix(cfg.Advertise, fmt.Sprintf(":%d", peerPort)) || !strings.HasPrefix(cfg.Advertise, "10.1.2.3:") {
		bad("advertise %q is not the pod's (or node's) IP at the peer port %d", cfg.Advertise, peerPort)
	}

	// The socket: on the hostPath directory, handed to the engines' group.
	sockDir := filepath.Dir(cfg.Socket)
	hostDir := ""
	for _, m := range c.VolumeMounts {
		if m.MountPath != sockDir {
			continue
		}
		for _, v := range spec.Volumes {
			if v.Name == m.Name && v.HostPath != nil {
				hostDir = v.HostPath.Path
			}
		}
	}
	if hostDir != sockDir {
		bad("socket %s is not on a hostPath directory mounted at the same path (hostPath %q)", cfg.Socket, hostDir)
	}
	if cfg.SocketGroup == "" {
		bad("no socket-group: engines in another group cannot connect")
	}

	// Memory: the pool fits, and may be locked and registered.
	caps := c.SecurityContext
	if caps == nil || caps.Capabilities == nil || !hasCap(caps.Capabilities.Add, "IPC_LOCK") {
		bad("no IPC_LOCK: mlock and registration of the pool are bound by RLIMIT_MEMLOCK")
	}
	pool := resource.NewQuantity(int64(cfg.PoolSize), resource.BinarySI)
	lim := c.Resources.Limits
	if cfg.PoolHugePages == "2M" || cfg.PoolHugePages == "1G" {
		name := corev1.ResourceName("hugepages-" + map[string]string{"2M": "2Mi", "1G": "1Gi"}[cfg.PoolHugePages])
		if q, ok := lim[name]; !ok || q.Cmp(*pool) < 0 {
			bad("pool-hugepages %s: %s limit %v below pool-size %s", cfg.PoolHugePages, name, q.String(), cfg.PoolSize)
		}
	} else if q := lim[corev1.ResourceMemory]; q.Cmp(*pool) < 0 {
		bad("memory limit %s below pool-size %s", q.String(), cfg.PoolSize)
	}

	// TLS: the files are the mounted secret's, and a change reaches pegad.
	if cfg.PeerTLSCert != "" {
		dir := filepath.Dir(cfg.PeerTLSCert)
		ok := false
		for _, m := range c.VolumeMounts {
			for _, v := range spec.Volumes {
				if v.Name == m.Name && m.MountPath == dir && v.Secret != nil {
					ok = true
				}
			}
		}
		if !ok || filepath.Dir(cfg.PeerTLSKey) != dir || filepath.Dir(cfg.PeerTLSCA) != dir {
			bad("peer TLS files %s, %s, %s are not in a mounted secret", cfg.PeerTLSCert, cfg.PeerTLSKey, cfg.PeerTLSCA)
		}
		reloader := container(o, "tls-reloader")
		restart := o.ds.Annotations["secret.reloader.stakater.com/reload"] != ""
		switch {
		case reloader != nil && (spec.ShareProcessNamespace == nil || !*spec.ShareProcessNamespace):
			bad("the TLS reloader cannot signal pegad without shareProcessNamespace")
		case reloader == nil && !restart:
			bad("peer TLS secret changes reach pegad neither by SIGHUP nor by a restart")
		}
	}

	// The kubelet expands $(VAR) in commands and args: every such
	// reference must be a variable the container defines ($$( is a
	// literal "$(" for a shell).
	for _, ct := range spec.Containers {
		defined := map[string]bool{}
		for _, e := range ct.Env {
			defined[e.Name] = true
		}
		for _, a := range append(append([]string{}, ct.Command...), ct.Args...) {
			for _, m := range varRef.FindAllStringSubmatch(strings.ReplaceAll(a, "$$", ""), -1) {
				if !defined[m[1]] {
					bad("container %s: %q in its command is not a variable it defines (write $$( for a shell)", ct.Name, m[0])
				}
			}
		}
	}

	// Monitoring scrapes the declared metrics port.
	if o.pm != nil && (len(o.pm.Spec.PodMetricsEndpoints) != 1 || namedPort(c, o.pm.Spec.PodMetricsEndpoints[0].Port) != metricsPort) {
		bad("PodMonitor does not scrape the metrics port")
	}
	if o.sm != nil {
		if o.svc == nil || len(o.sm.Spec.Endpoints) != 1 || len(o.svc.Spec.Ports) != 1 ||
			o.sm.Spec.Endpoints[0].Port != o.svc.Spec.Ports[0].Name || int(o.svc.Spec.Ports[0].Port) != metricsPort {
			bad("ServiceMonitor does not scrape the metrics port through the Service")
		}
		if o.svc != nil && !reflect.DeepEqual(o.svc.Spec.Selector, o.ds.Spec.Template.Labels) {
			bad("Service selects %v, pods carry %v", o.svc.Spec.Selector, o.ds.Spec.Template.Labels)
		}
	}
	if o.pm == nil && o.sm == nil {
		bad("nothing scrapes pegad")
	}
	return errs
}

// probePort resolves a probe's port: a number, or a container port's name.
func probePort(c *corev1.Container, p intstr.IntOrString) int {
	if p.Type == intstr.String {
		return namedPort(c, p.StrVal)
	}
	return int(p.IntVal)
}

func hasCap(caps []corev1.Capability, want corev1.Capability) bool {
	for _, c := range caps {
		if c == want {
			return true
		}
	}
	return false
}

// TestChart renders the chart with its defaults and three variants,
// decodes every object strictly and checks the invariants.
func TestChart(t *testing.T) {
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			o := decode(t, render(t, v.values))
			for _, e := range check(t, o) {
				t.Error(e)
			}
			if o.rule != nil {
				checkRules(t, o.rule)
			}
		})
	}
}

// TestChartChecksCanFail: the checks catch a drain cut short by SIGKILL
// and by the liveness probe, a flag pegad serve does not have, a PEGAD_*
// variable that is no setting, a probe on the wrong port and a config key
// pegad does not know.
func TestChartChecksCanFail(t *testing.T) {
	cases := []struct {
		name   string
		values string
		mutate func(o *objects)
		want   string
	}{
		{"drain longer than the grace period", "config: {shutdown-timeout: 95s}", nil, "terminationGracePeriodSeconds"},
		{"drain longer than liveness", "livenessFailureThreshold: 3", nil, "liveness probe kills"},
		{"unknown flag", "", func(o *objects) {
			c := container(o, "pegad")
			c.Args = append(c.Args, "--pool-bytes=1G")
		}, "refuses the pod's flags"},
		{"unknown env", "", func(o *objects) {
			c := container(o, "pegad")
			c.Env = append(c.Env, corev1.EnvVar{Name: "PEGAD_POOLSIZE", Value: "1G"})
		}, "no setting"},
		{"probe port", "", func(o *objects) {
			container(o, "pegad").ReadinessProbe.HTTPGet.Port = intstr.FromInt32(9999)
		}, "readiness probe port"},
		{"unknown config key", "config: {pool_size: 1GiB}", nil, "refuses the pod's configuration"},
		{"pool above the memory limit", "memory: 8Gi", nil, "memory limit"},
		{"shell substitution the kubelet would expand", "peerTLS: {enabled: true}", func(o *objects) {
			c := container(o, "tls-reloader")
			c.Command[2] = strings.ReplaceAll(c.Command[2], "$$(", "$(")
		}, "is not a variable it defines"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o := decode(t, render(t, tc.values))
			if tc.mutate != nil {
				tc.mutate(o)
			}
			errs := check(t, o)
			if !strings.Contains(strings.Join(errs, "\n"), tc.want) {
				t.Fatalf("problems %q, want one containing %q", errs, tc.want)
			}
		})
	}
}

// checkRules: the PrometheusRule carries deploy/prometheus/alerts.yaml's
// groups unchanged.
func checkRules(t *testing.T, rule *monitoringv1.PrometheusRule) {
	t.Helper()
	raw, err := os.ReadFile(alertsFile)
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		Groups []monitoringv1.RuleGroup `json:"groups"`
	}
	if err := strict(string(raw), &file); err != nil {
		t.Fatalf("%s: %v", alertsFile, err)
	}
	if len(file.Groups) == 0 || !reflect.DeepEqual(file.Groups, rule.Spec.Groups) {
		t.Fatalf("PrometheusRule groups differ from %s", alertsFile)
	}
}

// operatorGroup is the API group of the Prometheus Operator's objects.
const operatorGroup = "monitoring.coreos.com/"

// manifestHeader heads each generated file.
func manifestHeader(what string) string {
	return "# pegad for Kubernetes without Helm: " + what + "\n" +
		"# deploy/helm/pegad rendered with its default values (release \"pegad\",\n" +
		"# namespace \"pegad\"). Generated: edit the chart, then run\n" +
		"# `make k8s-manifests`; deploy/kubernetes/chart_test.go fails when this\n" +
		"# file and the chart differ.\n"
}

// renderedManifests is the chart's default render as two YAML streams:
// the objects of built-in APIs (pegad.yaml), which apply on any cluster,
// and the Prometheus Operator's (pegad-monitoring.yaml), which need its
// CRDs.
func renderedManifests(t *testing.T) map[string]string {
	t.Helper()
	o := decode(t, render(t, ""))
	core, mon := new(strings.Builder), new(strings.Builder)
	core.WriteString(manifestHeader("the DaemonSet and its ConfigMap. The\n" +
		"# PodMonitor and PrometheusRule are in pegad-monitoring.yaml (they need the\n" +
		"# Prometheus Operator's CRDs)."))
	mon.WriteString(manifestHeader("the Prometheus Operator's objects\n" +
		"# (scrape and alert rules), beside pegad.yaml. Apply only where the\n" +
		"# Operator's CRDs are installed."))
	for _, d := range o.docs {
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(d), &tm); err != nil {
			t.Fatal(err)
		}
		b := core
		if strings.HasPrefix(tm.APIVersion, operatorGroup) {
			b = mon
		}
		b.WriteString("---\n")
		b.WriteString(strings.TrimLeft(strings.TrimRight(d, "\n"), "\n"))
		b.WriteString("\n")
	}
	return map[string]string{manifests: core.String(), monitoringManifests: mon.String()}
}

// generated are the files `make k8s-manifests` writes
// (PEGAD_UPDATE_MANIFESTS=1), in order: the chart's copy of the alert
// rules first, as the manifests are rendered from it.
var generated = []struct {
	file string
	want func(t *testing.T) string
}{
	{vendoredAlerts, func(t *testing.T) string {
		t.Helper()
		raw, err := os.ReadFile(alertsFile)
		if err != nil {
			t.Fatal(err)
		}
		return string(raw)
	}},
	{manifests, func(t *testing.T) string { t.Helper(); return renderedManifests(t)[manifests] }},
	{monitoringManifests, func(t *testing.T) string { t.Helper(); return renderedManifests(t)[monitoringManifests] }},
}

// TestManifests: the chart's files/alerts.yaml is deploy/prometheus/
// alerts.yaml byte for byte (a real file, not a link out of the chart),
// and pegad.yaml and pegad-monitoring.yaml are the chart's default
// render (PEGAD_UPDATE_MANIFESTS=1 rewrites all three: make k8s-manifests).
func TestManifests(t *testing.T) {
	for _, g := range generated {
		t.Run(filepath.Base(g.file), func(t *testing.T) {
			want := g.want(t)
			if os.Getenv("PEGAD_UPDATE_MANIFESTS") == "1" {
				if fi, err := os.Lstat(g.file); err == nil && fi.Mode()&os.ModeSymlink != 0 {
					if err := os.Remove(g.file); err != nil {
						t.Fatal(err)
					}
				}
				if err := os.WriteFile(g.file, []byte(want), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			fi, err := os.Lstat(g.file)
			if err != nil {
				t.Fatal(err)
			}
			if !fi.Mode().IsRegular() {
				t.Fatalf("%s is a %s, not a regular file: the chart breaks when copied alone (run make k8s-manifests)", g.file, fi.Mode().Type())
			}
			got, err := os.ReadFile(g.file)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != want {
				t.Fatalf("%s differs from what it is generated from: run make k8s-manifests", g.file)
			}
		})
	}
}

// TestManifestsApplyWithoutOperator: pegad.yaml holds only objects of
// built-in APIs, so `kubectl apply -f pegad.yaml` works on a cluster
// without the Prometheus Operator; pegad-monitoring.yaml holds only the
// Operator's objects, and the two together are the whole default render.
func TestManifestsApplyWithoutOperator(t *testing.T) {
	builtin := map[string]bool{"v1": true, "apps/v1": true}
	cases := []struct {
		file     string
		allowed  func(apiVersion string) bool
		problems string
	}{
		{manifests, func(v string) bool { return builtin[v] }, "needs a CRD: a cluster without the Prometheus Operator refuses the file"},
		{monitoringManifests, func(v string) bool { return strings.HasPrefix(v, operatorGroup) }, "is not a Prometheus Operator object"},
	}
	total := 0
	for _, tc := range cases {
		t.Run(tc.file, func(t *testing.T) {
			raw, err := os.ReadFile(tc.file)
			if err != nil {
				t.Fatal(err)
			}
			docs := splitDocs(string(raw))
			if len(docs) == 0 {
				t.Fatalf("%s holds no object", tc.file)
			}
			for _, d := range docs {
				var tm metav1.TypeMeta
				if err := yaml.Unmarshal([]byte(d), &tm); err != nil {
					t.Fatal(err)
				}
				if !tc.allowed(tm.APIVersion) {
					t.Errorf("%s: %s %s %s", tc.file, tm.APIVersion, tm.Kind, tc.problems)
				}
				total++
			}
		})
	}
	if want := len(decode(t, render(t, "")).docs); total != want {
		t.Errorf("the two files hold %d objects; the default render has %d", total, want)
	}
}

// TestChartStandsAlone: the chart copied on its own (as `helm package`
// or a copy into another repository takes it: links kept as links)
// loads, and its PrometheusRule still carries every alert.
func TestChartStandsAlone(t *testing.T) {
	dst := filepath.Join(t.TempDir(), "pegad")
	if err := copyKeepingLinks(chartDir, dst); err != nil {
		t.Fatal(err)
	}
	ch, err := loader.Load(dst)
	if err != nil {
		t.Fatalf("the chart copied alone does not load: %v", err)
	}
	rv, err := util.ToRenderValues(ch, map[string]any{}, common.ReleaseOptions{Name: releaseName, Namespace: namespace, IsInstall: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	out, err := engine.Render(ch, rv)
	if err != nil {
		t.Fatalf("the chart copied alone does not render: %v", err)
	}
	o := decode(t, out)
	if o.rule == nil {
		t.Fatal("the chart copied alone renders no PrometheusRule")
	}
	checkRules(t, o.rule)
}

// copyKeepingLinks copies the tree at src to dst, links as links.
func copyKeepingLinks(src, dst string) error {
	return filepath.WalkDir(src, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		to := filepath.Join(dst, rel)
		switch {
		case d.Type()&os.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			return os.Symlink(target, to)
		case d.IsDir():
			return os.MkdirAll(to, 0o755)
		default:
			raw, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			return os.WriteFile(to, raw, 0o644)
		}
	})
}

// TestEngineExample: examples/vllm.yaml decodes strictly, runs where
// pegad runs, mounts the chart's socket directory at the same path, runs
// in the socket's group, and points the pegad connector at the socket the
// chart configures.
func TestEngineExample(t *testing.T) {
	raw, err := os.ReadFile(engineFile)
	if err != nil {
		t.Fatal(err)
	}
	docs := splitDocs(string(raw))
	if len(docs) != 1 {
		t.Fatalf("%s: %d documents, want 1", engineFile, len(docs))
	}
	var dep appsv1.Deployment
	if err := strict(docs[0], &dep); err != nil {
		t.Fatalf("%s: %v", engineFile, err)
	}
	o := decode(t, render(t, ""))
	cfg, errs := pegadConfig(t, o, *container(o, "pegad"))
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	spec := dep.Spec.Template.Spec
	if !reflect.DeepEqual(spec.NodeSelector, o.ds.Spec.Template.Spec.NodeSelector) {
		t.Errorf("engine nodeSelector %v; pegad runs on %v", spec.NodeSelector, o.ds.Spec.Template.Spec.NodeSelector)
	}
	gid, _ := strconv.ParseInt(cfg.SocketGroup, 10, 64)
	if spec.SecurityContext == nil || !slices.Contains(spec.SecurityContext.SupplementalGroups, gid) {
		t.Errorf("engine does not run in the socket's group %s", cfg.SocketGroup)
	}
	if len(spec.Containers) != 1 {
		t.Fatalf("%d containers", len(spec.Containers))
	}
	c := spec.Containers[0]
	sockDir := filepath.Dir(cfg.Socket)
	mounted := false
	for _, m := range c.VolumeMounts {
		for _, v := range spec.Volumes {
			if v.Name == m.Name && v.HostPath != nil && v.HostPath.Path == sockDir && m.MountPath == sockDir {
				mounted = true
			}
		}
	}
	if !mounted {
		t.Errorf("engine does not mount hostPath %s at %s", sockDir, sockDir)
	}
	// The connector: --kv-transfer-config's JSON names pegad.vllm and the socket.
	var ktc struct {
		Connector  string         `json:"kv_connector"`
		ModulePath string         `json:"kv_connector_module_path"`
		Role       string         `json:"kv_role"`
		Extra      map[string]any `json:"kv_connector_extra_config"`
	}
	found := false
	for i, a := range c.Args {
		if a == "--kv-transfer-config" && i+1 < len(c.Args) {
			dec := json.NewDecoder(strings.NewReader(c.Args[i+1]))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&ktc); err != nil {
				t.Fatalf("--kv-transfer-config: %v", err)
			}
			found = true
		}
	}
	if !found || ktc.ModulePath != "pegad.vllm" || ktc.Connector == "" || ktc.Role != "kv_both" {
		t.Errorf("kv-transfer-config %+v: want the connector from module pegad.vllm, kv_both", ktc)
	}
	if ktc.Extra["socket"] != cfg.Socket {
		t.Errorf("connector socket %v; pegad's is %s", ktc.Extra["socket"], cfg.Socket)
	}
	env := map[string]string{}
	for _, e := range c.Env {
		env[e.Name] = e.Value
	}
	if env["PEGAD_SOCKET"] != cfg.Socket {
		t.Errorf("PEGAD_SOCKET %q; pegad's socket is %s", env["PEGAD_SOCKET"], cfg.Socket)
	}
	if env["PYTHONHASHSEED"] == "" {
		t.Error("PYTHONHASHSEED unset: block hashes would differ between engine processes")
	}
}
