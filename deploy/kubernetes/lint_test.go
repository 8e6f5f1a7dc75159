package kubernetes

import (
	"testing"

	"sigs.k8s.io/yaml"

	"helm.sh/helm/v4/pkg/chart/v2/lint"
	"helm.sh/helm/v4/pkg/chart/v2/lint/support"
)

// TestHelmLint runs `helm lint`'s rules (Helm's Go package) on the chart
// with each variant's values: no warning, no error. Info messages (an
// icon is recommended) are allowed.
func TestHelmLint(t *testing.T) {
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			vals := map[string]any{}
			if err := yaml.Unmarshal([]byte(v.values), &vals); err != nil {
				t.Fatal(err)
			}
			l := lint.RunAll(chartDir, vals, namespace)
			for _, m := range l.Messages {
				if m.Severity >= support.WarningSev {
					t.Errorf("helm lint: %s", m)
				}
			}
		})
	}
	// And the rules do fail values that render broken YAML (lint mode
	// ignores the chart's own fail calls).
	l := lint.RunAll(chartDir, map[string]any{"image": map[string]any{"repository": "a: b"}}, namespace)
	if l.HighestSeverity < support.ErrorSev {
		t.Errorf("helm lint passed an image that breaks the YAML: %v", l.Messages)
	}
}
