package cli

import (
	"bytes"
	"strings"
	"testing"

	"github.com/pegaflow/pegad/internal/version"
)

func run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	t.Setenv("PEGAD_CONFIG", "")
	root := NewRootCommand()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(args)
	err := root.Execute()
	return out.String(), err
}

func TestVersion(t *testing.T) {
	out, err := run(t, "version")
	if err != nil || strings.TrimSpace(out) != version.String() {
		t.Fatalf("version: %q, %v", out, err)
	}
}

// TestFlagsReachConfig: serve's flags work on the bare root and on serve;
// invalid values stop before anything starts, naming the key.
func TestFlagsReachConfig(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"--pool-size=lots"}, "pool-size"},
		{[]string{"serve", "--pool-size=lots"}, "pool-size"},
		{[]string{"serve", "--transport=ib"}, "transport"},
		{[]string{"--qps-per-peer=0"}, "qps-per-peer"},
		{[]string{"--no-such-flag"}, "unknown flag"},
		{[]string{"serve", "extra-arg"}, "unknown command"},
	}
	for _, tc := range tests {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			_, err := run(t, tc.args...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
}
