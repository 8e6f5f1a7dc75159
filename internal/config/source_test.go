package config

import (
	"strings"
	"testing"
)

// TestDecodeErrorsNameTheirSource: a value that does not parse names where
// it came from: the PEGAD_* variable and its value, or the file and key.
func TestDecodeErrorsNameTheirSource(t *testing.T) {
	tests := []struct {
		name string
		env  map[string]string
		file string
		want []string
	}{
		{"env int", map[string]string{"PEGAD_QPS_PER_PEER": "two"}, "", []string{`qps-per-peer (PEGAD_QPS_PER_PEER="two"): is not an integer`}},
		{"env bool", map[string]string{"PEGAD_PEER_REFLECTION": "maybe"}, "", []string{`peer-reflection (PEGAD_PEER_REFLECTION="maybe"): is not true or false`}},
		{"env size", map[string]string{"PEGAD_POOL_SIZE": "lots"}, "", []string{`pool-size (PEGAD_POOL_SIZE="lots"): invalid size "lots"`}},
		{"env duration", map[string]string{"PEGAD_LOCK_TIMEOUT": "5"}, "", []string{`lock-timeout (PEGAD_LOCK_TIMEOUT="5"): invalid duration "5"`}},
		{"file int", nil, "qps-per-peer: two\n", []string{`qps-per-peer (in /`, `pegad.yaml): is not an integer`}},
		{"two at once", map[string]string{"PEGAD_QPS_PER_PEER": "x", "PEGAD_NICS": "1"}, "peer-reflection: maybe\n",
			[]string{`PEGAD_QPS_PER_PEER="x"`, `pegad.yaml): is not true or false`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := load(t, nil, tc.env, tc.file)
			if err == nil {
				t.Fatal("loaded")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
			if strings.Contains(err.Error(), "strconv.") {
				t.Errorf("error %q still carries strconv's wrapping", err)
			}
		})
	}
}
