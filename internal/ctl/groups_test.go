package ctl

import (
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// TestGroupsNeedSubcommand (issue 33 item 10): every command that holds
// subcommands (pegactl itself, blocks, conns, ...), run bare, prints its
// help and fails with a usage error naming its subcommands, instead of
// exiting 0 having done nothing; its --help still exits 0.
func TestGroupsNeedSubcommand(t *testing.T) {
	var groups [][]string
	var walk func(c *cobra.Command, path []string)
	walk = func(c *cobra.Command, path []string) {
		if c.HasSubCommands() {
			groups = append(groups, path)
		}
		for _, sub := range c.Commands() {
			walk(sub, append(append([]string{}, path...), sub.Name()))
		}
	}
	walk(NewRootCommand(Streams{}), nil)
	if len(groups) < 7 {
		t.Fatalf("found %d groups (%v), want pegactl, blocks, bench, sessions, locks, conns, nodes at least", len(groups), groups)
	}
	for _, path := range groups {
		name := strings.Join(append([]string{"pegactl"}, path...), " ")
		r := run(t, nil, path...)
		wantError(t, r, ExitUsage, "needs a subcommand: ")
		if !strings.Contains(r.stdout, "Usage:") || !strings.Contains(r.stderr, `"`+name+`"`) {
			t.Errorf("%s bare: stdout %q, stderr %q; want its help on stdout and its name in the error", name, r.stdout, r.stderr)
		}
		if r := run(t, nil, append(path, "--help")...); r.code != 0 || !strings.Contains(r.stdout, "Usage:") {
			t.Errorf("%s --help: exit %d, stdout %q; want 0 and its help", name, r.code, r.stdout)
		}
	}
}
