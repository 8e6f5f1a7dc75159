package cli

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/pegaflow/pegad/internal/ibv/verbs"
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

// TestConfigErrorsExit78: every configuration error (flag, environment,
// file, value, a tcp plan that would advertise loopback) exits 78, so a
// unit's RestartPreventExitStatus=78 stops restart loops; other failures
// exit 1.
func TestConfigErrorsExit78(t *testing.T) {
	tests := []struct {
		args []string
		env  map[string]string
		want int
	}{
		{[]string{"--pool-size=lots"}, nil, ExitConfig},
		{[]string{"serve", "--transport=ib"}, nil, ExitConfig},
		{[]string{"--no-such-flag"}, nil, ExitConfig},
		{[]string{"--qps-per-peer", "two"}, nil, ExitConfig},
		{nil, map[string]string{"PEGAD_QPS_PER_PEER": "two"}, ExitConfig},
		{[]string{"--listen", "0.0.0.0:0", "--advertise", "127.0.0.1:50055", "--transport", "tcp",
			"--metrics-listen", "", "--pool-size", "4MiB"}, nil, ExitConfig},
		// Issue 23: a pool larger than the host, refused before it is mapped.
		{[]string{"--listen", "127.0.0.1:0", "--transport", "tcp", "--metrics-listen", "", "--pool-size", "65536TiB"}, nil, ExitConfig},
	}
	if ok, _ := verbs.Available(); !ok {
		// Issue 23: verbs asked for on a host without it (this one).
		tests = append(tests, struct {
			args []string
			env  map[string]string
			want int
		}{[]string{"--listen", "127.0.0.1:0", "--transport", "verbs", "--metrics-listen", "", "--pool-size", "4MiB"}, nil, ExitConfig})
	}
	for _, tc := range tests {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			args := append([]string{"--socket", t.TempDir() + "/s.sock"}, tc.args...)
			if len(tc.args) > 0 && tc.args[0] == "serve" {
				args = append([]string{"serve", "--socket", t.TempDir() + "/s.sock"}, tc.args[1:]...)
			}
			_, err := run(t, args...)
			if got := exitCode(err); got != tc.want {
				t.Fatalf("exit %d for %v, want %d", got, err, tc.want)
			}
		})
	}
	// A runtime failure (the socket path is a directory) is not a config error.
	dir := t.TempDir()
	_, err := run(t, "--socket", dir, "--metrics-listen", "", "--listen", "127.0.0.1:0", "--pool-size", "4MiB", "--transport", "tcp")
	if err == nil || exitCode(err) != ExitError {
		t.Fatalf("runtime failure: exit %d for %v, want %d", exitCode(err), err, ExitError)
	}
}

// TestGroupsNeedSubcommand (issue 33 item 10): a command that only holds
// subcommands (every one but the root, which runs serve), run bare,
// prints its help and exits 1 naming them; its --help still succeeds.
func TestGroupsNeedSubcommand(t *testing.T) {
	var groups []*cobra.Command
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		for _, sub := range c.Commands() {
			if sub.HasSubCommands() {
				groups = append(groups, sub)
			}
			walk(sub)
		}
	}
	walk(NewRootCommand())
	if len(groups) == 0 {
		t.Fatal("no group commands found (want config at least)")
	}
	for _, g := range groups {
		args := strings.Fields(strings.TrimPrefix(g.CommandPath(), "pegad "))
		out, err := run(t, args...)
		if exitCode(err) != ExitError || !strings.Contains(fmt.Sprint(err), g.CommandPath()+" needs a subcommand: ") ||
			!strings.Contains(out, "Usage:") {
			t.Errorf("%s bare: exit %d (%v), output %q; want %d naming its subcommands after its help", g.CommandPath(), exitCode(err), err, out, ExitError)
		}
		if out, err := run(t, append(args, "--help")...); err != nil || !strings.Contains(out, "Usage:") {
			t.Errorf("%s --help: %v, %q", g.CommandPath(), err, out)
		}
	}
}
