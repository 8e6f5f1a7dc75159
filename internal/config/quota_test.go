package config

import (
	"reflect"
	"strings"
	"testing"
)

// TestNamespaceQuota: the key comes from repeated flags, a YAML list, a
// comma list in the env or the file, and parses into NS and SIZE; bad
// entries are refused at load naming the key.
func TestNamespaceQuota(t *testing.T) {
	for _, tc := range []struct {
		name    string
		args    []string
		env     map[string]string
		file    string
		want    []NamespaceQuota
		wantErr string // substring; "" when it loads
	}{
		{"none", nil, nil, "", nil, ""},
		{"repeated flags", []string{"--namespace-quota=llama=1GiB", "--namespace-quota", "llama/70b = 512MiB"}, nil, "",
			[]NamespaceQuota{{"llama", 1 << 30}, {"llama/70b", 512 << 20}}, ""},
		{"yaml list", nil, nil, "namespace-quota:\n  - a=4MiB\n  - b=1G\n",
			[]NamespaceQuota{{"a", 4 << 20}, {"b", 1 << 30}}, ""},
		{"yaml string", nil, nil, "namespace-quota: a=4MiB,b=8MiB\n",
			[]NamespaceQuota{{"a", 4 << 20}, {"b", 8 << 20}}, ""},
		{"env", nil, map[string]string{"PEGAD_NAMESPACE_QUOTA": "a=4MiB,b=8MiB"}, "",
			[]NamespaceQuota{{"a", 4 << 20}, {"b", 8 << 20}}, ""},
		{"flag over file", []string{"--namespace-quota=a=1MiB"}, nil, "namespace-quota: [b=2MiB]\n",
			[]NamespaceQuota{{"a", 1 << 20}}, ""},
		{"bad size", []string{"--namespace-quota=a=lots"}, nil, "", nil, "namespace-quota"},
		{"empty namespace", []string{"--namespace-quota==1GiB"}, nil, "", nil, "empty namespace"},
		{"no size", []string{"--namespace-quota=a"}, nil, "", nil, "not NS=SIZE"},
		{"zero size", nil, nil, "namespace-quota: [a=0]\n", nil, "0 bytes"},
		{"twice", []string{"--namespace-quota=a=1MiB", "--namespace-quota=a=2MiB"}, nil, "", nil, "given twice"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := load(t, tc.args, tc.env, tc.file)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), "namespace-quota") {
					t.Fatalf("Load = %v, want an error on namespace-quota saying %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got, err := c.NamespaceQuotas()
			if err != nil || !reflect.DeepEqual(got, tc.want) {
				t.Errorf("NamespaceQuotas() = %v, %v; want %v", got, err, tc.want)
			}
		})
	}
}
