// Package deploy holds what an operator installs beside the binaries: the
// systemd unit, Prometheus alerts with their promtool tests, and the
// Grafana dashboard. Its tests keep them true to the program: the unit has
// what RDMA and the daemon's notify protocol need, and every metric and
// label the alerts and the dashboard name is exported by a live pegad.
package deploy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"go.yaml.in/yaml/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/internal/testutil"
	"github.com/pegaflow/pegad/internal/testutil/cluster"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	unitPath      = "systemd/pegad.service"
	alertsPath    = "prometheus/alerts.yaml"
	alertsTest    = "prometheus/alerts_test.yaml"
	dashboardPath = "grafana/pegad.json"
)

// unitDirectives reads the [Service] section as key → values.
func unitDirectives(t *testing.T) map[string][]string {
	t.Helper()
	f, err := os.Open(unitPath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string][]string{}
	section := ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#"):
		case strings.HasPrefix(line, "["):
			section = line
		case section == "[Service]":
			k, v, _ := strings.Cut(line, "=")
			out[k] = append(out[k], v)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestUnit: the unit keeps what pegad needs under systemd: notify and
// watchdog, restart on failure, unlimited memlock, the RDMA devices and
// netlink allowed despite the hardening.
func TestUnit(t *testing.T) {
	d := unitDirectives(t)
	has := func(key, want string) bool {
		for _, v := range d[key] {
			if v == want || strings.Contains(" "+v+" ", " "+want+" ") {
				return true
			}
		}
		return false
	}
	for _, c := range []struct{ key, want string }{
		{"Type", "notify"},
		{"Restart", "on-failure"},
		{"LimitMEMLOCK", "infinity"},
		{"DeviceAllow", "char-infiniband_verbs"},
		{"DeviceAllow", "/dev/infiniband/rdma_cm"},
		{"RestrictAddressFamilies", "AF_NETLINK"},
		{"RestrictAddressFamilies", "AF_UNIX"},
		{"CapabilityBoundingSet", "CAP_IPC_LOCK"},
		{"RuntimeDirectory", "pegad"},
	} {
		if !has(c.key, c.want) {
			t.Errorf("unit: %s= lacks %s (has %q)", c.key, c.want, d[c.key])
		}
	}
	if w := d["WatchdogSec"]; len(w) != 1 || w[0] == "" || w[0] == "0" {
		t.Errorf("unit: WatchdogSec=%q, want an interval", w)
	}
	for _, v := range d["PrivateDevices"] {
		if v == "yes" || v == "true" {
			t.Error("unit: PrivateDevices= hides /dev/infiniband")
		}
	}
	if e := d["ExecStart"]; len(e) != 1 || !strings.Contains(e[0], "pegad serve --config ") {
		t.Errorf("unit: ExecStart=%q", e)
	}
}

// TestUnitVerifies: systemd-analyze verify finds nothing to say about the
// unit (unknown keys and bad values are only warnings there, so any output
// fails). Skipped without systemd-analyze.
func TestUnitVerifies(t *testing.T) {
	sa, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("systemd-analyze not installed")
	}
	unit, err := os.ReadFile(unitPath)
	if err != nil {
		t.Fatal(err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// verify wants ExecStart's binary to exist.
	unit = bytes.ReplaceAll(unit, []byte("/usr/local/bin/pegad"), []byte(exe))
	p := filepath.Join(t.TempDir(), "pegad.service")
	if err := os.WriteFile(p, unit, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(sa, "verify", p).CombinedOutput()
	if err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}
}

// TestPromtool runs the rule checks `make alerts-check` runs, when
// promtool is installed (CI installs it).
func TestPromtool(t *testing.T) {
	pt, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool not installed (Debian package prometheus)")
	}
	for _, args := range [][]string{{"check", "rules", alertsPath}, {"test", "rules", alertsTest}} {
		if out, err := exec.Command(pt, args...).CombinedOutput(); err != nil {
			t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// exprs returns every PromQL expression of the alert rules and the
// dashboard (panel targets and template queries), each with where it is.
func exprs(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	raw, err := os.ReadFile(alertsPath)
	if err != nil {
		t.Fatal(err)
	}
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert, Record, Expr string
			}
		}
	}
	if err := yaml.Unmarshal(raw, &rules); err != nil {
		t.Fatal(err)
	}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			out[alertsPath+" "+r.Alert+r.Record] = r.Expr
		}
	}
	raw, err = os.ReadFile(dashboardPath)
	if err != nil {
		t.Fatal(err)
	}
	type target struct{ Expr string }
	type panel struct {
		Title   string
		Targets []target
		Panels  []panel
	}
	var dash struct {
		Panels     []panel
		Templating struct {
			List []struct {
				Name, Definition string
			}
		}
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatal(err)
	}
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			for i, tg := range p.Targets {
				out[dashboardPath+" "+p.Title+" #"+string(rune('A'+i))] = tg.Expr
			}
			walk(p.Panels)
		}
	}
	walk(dash.Panels)
	for _, v := range dash.Templating.List {
		if v.Definition != "" {
			out[dashboardPath+" variable "+v.Name] = v.Definition
		}
	}
	return out
}

var (
	metricRef  = regexp.MustCompile(`\b((?:pegaflow|pegad)_[a-zA-Z0-9_]+)\b(\{[^}]*\})?`)
	matcherRef = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!=|!~|=)`)
	groupRef   = regexp.MustCompile(`\b(?:by|without)\s*\(([^)]*)\)`)
)

// targetLabels are attached by Prometheus at scrape time, not by pegad.
var targetLabels = map[string]bool{"job": true, "instance": true}

// addLabels adds the samples of a scrape (cluster.Scrape) to into as
// metric name → label names.
func addLabels(samples map[string]float64, into map[string]map[string]bool) {
	for key := range samples {
		name, labels, _ := strings.Cut(key, "{")
		if into[name] == nil {
			into[name] = map[string]bool{}
		}
		for _, m := range matcherRef.FindAllStringSubmatch(labels, -1) {
			into[name][m[1]] = true
		}
	}
}

// TestAlertsAndDashboardNameExportedMetrics scrapes two live daemons after
// a prefetch between them (and with a session live on the holder) and
// fails if an alert rule or a dashboard query names a metric, or a label
// of one, that pegad does not export.
func TestAlertsAndDashboardNameExportedMetrics(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := func(name string) (*cluster.Node, pegadv1.LocalServiceClient) {
		n := cluster.Start(t, cluster.Named(name))
		return n, n.Local
	}
	holder, hl := start("deploy-holder")
	req, rl := start("deploy-requester")

	body := bytes.Repeat([]byte{7}, 64<<10)
	for _, h := range []byte{1, 2} {
		if _, err := testutil.PutBlock(ctx, hl, "ns", []byte{h}, body, false); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := rl.Prefetch(ctx, &pegadv1.PrefetchRequest{Peer: holder.PeerAddr(), Namespace: "ns",
		Hashes: [][]byte{{1}}}); err != nil {
		t.Fatal(err)
	}
	// A live session on the holder, as a requester mid-read has.
	pc, err := grpc.NewClient(holder.PeerAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	if _, err := pegadv1.NewPeerServiceClient(pc).QueryBlocksForTransfer(ctx, &pegadv1.QueryBlocksForTransferRequest{
		Namespace: "ns", Hashes: [][]byte{{2}}, Requester: &pegadv1.Requester{NodeId: "r", Incarnation: "i"}}); err != nil {
		t.Fatal(err)
	}

	exported := map[string]map[string]bool{}
	addLabels(holder.Scrape(t), exported)
	addLabels(req.Scrape(t), exported)

	checked := 0
	for where, expr := range exprs(t) {
		seen := map[string]bool{} // labels of the metrics this expression reads
		for _, m := range metricRef.FindAllStringSubmatch(expr, -1) {
			name := m[1]
			labels, ok := exported[name]
			if !ok {
				t.Errorf("%s: metric %s is not exported", where, name)
				continue
			}
			checked++
			for l := range labels {
				seen[l] = true
			}
			for _, lm := range matcherRef.FindAllStringSubmatch(m[2], -1) {
				if !labels[lm[1]] && !targetLabels[lm[1]] {
					t.Errorf("%s: %s has no label %q", where, name, lm[1])
				}
			}
		}
		for _, g := range groupRef.FindAllStringSubmatch(expr, -1) {
			for _, l := range strings.Split(g[1], ",") {
				if l = strings.TrimSpace(l); l != "" && !seen[l] && !targetLabels[l] {
					t.Errorf("%s: groups by %q, a label none of its metrics has", where, l)
				}
			}
		}
	}
	if checked < 30 {
		names := make([]string, 0, len(exported))
		for n := range exported {
			names = append(names, n)
		}
		sort.Strings(names)
		t.Fatalf("only %d metric references checked: the extraction is broken (exported: %v)", checked, names)
	}
}
