package kubernetes

import (
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// freeForm values are maps the user fills in (not documented key by key).
var freeForm = map[string]bool{"config": true, "nodeSelector": true, "affinity": true,
	"podAnnotations": true, "podLabels": true, "labels": true, "updateStrategy": true}

// valueKeys lists values.yaml's keys as dotted paths, down to leaves or
// free-form maps.
func valueKeys(prefix string, m map[string]any, out *[]string) {
	for k, v := range m {
		if sub, ok := v.(map[string]any); ok && len(sub) > 0 && !freeForm[k] {
			valueKeys(prefix+k+".", sub, out)
			continue
		}
		*out = append(*out, prefix+k)
	}
}

// TestDocs: docs/kubernetes.md's values table names every value of
// values.yaml and no other, and the files it tells the reader to use exist.
func TestDocs(t *testing.T) {
	raw, err := os.ReadFile("../../docs/kubernetes.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(raw)
	_, sec, ok := strings.Cut(doc, "\n## Values\n")
	if !ok {
		t.Fatal(`docs/kubernetes.md has no "## Values" section`)
	}
	sec, _, _ = strings.Cut(sec, "\n## ")
	documented := map[string]bool{}
	tick := regexp.MustCompile("`([^`]+)`")
	for _, line := range strings.Split(sec, "\n") {
		if !strings.HasPrefix(line, "| `") {
			continue
		}
		first := strings.Split(line, "|")[1]
		for _, m := range tick.FindAllStringSubmatch(first, -1) {
			documented[m[1]] = true
		}
	}
	vb, err := os.ReadFile(chartDir + "/values.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var values map[string]any
	if err := yaml.Unmarshal(vb, &values); err != nil {
		t.Fatal(err)
	}
	var keys []string
	valueKeys("", values, &keys)
	sort.Strings(keys)
	known := map[string]bool{}
	for _, k := range keys {
		known[k] = true
		if !documented[k] {
			t.Errorf("values.yaml's %s is not in docs/kubernetes.md's values table", k)
		}
	}
	for k := range documented {
		if !known[k] {
			t.Errorf("docs/kubernetes.md documents %s, which values.yaml does not have", k)
		}
	}
	for _, p := range []string{"deploy/helm/pegad", "deploy/kubernetes/pegad.yaml", "deploy/kubernetes/pegad-monitoring.yaml",
		"deploy/kubernetes/examples/vllm.yaml", "deploy/prometheus/alerts.yaml", "configs/pegad.yaml",
		"deploy/image/Dockerfile", "deploy/image/vllm.Dockerfile", "deploy/image/Dockerfile.dockerignore"} {
		if !strings.Contains(doc, p) {
			t.Errorf("docs/kubernetes.md does not mention %s", p)
		}
		if _, err := os.Stat("../../" + p); err != nil {
			t.Errorf("docs/kubernetes.md names %s: %v", p, err)
		}
	}
}
