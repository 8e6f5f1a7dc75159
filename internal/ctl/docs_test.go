package ctl

import (
	"bytes"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// docSections splits docs/pegactl.md into its "## " sections by title.
func docSections(t *testing.T) (map[string]string, string) {
	t.Helper()
	b, err := os.ReadFile("../../docs/pegactl.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	out := map[string]string{}
	parts := strings.Split("\n"+doc, "\n## ")
	for _, p := range parts[1:] {
		title, body, _ := strings.Cut(p, "\n")
		out[strings.TrimSpace(title)] = body
	}
	return out, doc
}

// leafCommands are the runnable commands of the tree, by path without
// "pegactl ".
func leafCommands(root *cobra.Command) map[string]*cobra.Command {
	out := map[string]*cobra.Command{}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if c != root && len(c.Commands()) == 0 && !c.Hidden && c.Name() != "help" {
			out[strings.TrimPrefix(c.CommandPath(), root.Name()+" ")] = c
		}
		for _, s := range c.Commands() {
			walk(s)
		}
	}
	walk(root)
	return out
}

var nonCommandSections = map[string]bool{
	"Global flags": true, "Errors and exit codes": true, "JSON conventions": true, "End-to-end scripts": true,
}

var flagToken = regexp.MustCompile(`(?:^|[\s\x60\[(])(--[a-z][a-z-]*)`)

// TestDocsMatchCLI: docs/pegactl.md documents exactly the commands the CLI
// has, each command's flags in its section, the global flags, and the exit
// codes; every flag the doc shows on a command exists there.
func TestDocsMatchCLI(t *testing.T) {
	sections, doc := docSections(t)
	root := NewRootCommand(Streams{In: &bytes.Buffer{}, Out: &bytes.Buffer{}, Err: &bytes.Buffer{}})
	leaves := leafCommands(root)

	global := map[string]bool{"--help": true}
	root.PersistentFlags().VisitAll(func(f *pflag.Flag) {
		global["--"+f.Name] = true
		if !strings.Contains(sections["Global flags"], "`--"+f.Name) {
			t.Errorf("global flag --%s is not in the Global flags table", f.Name)
		}
	})

	for path, c := range leaves {
		body, ok := sections[path]
		if !ok {
			t.Errorf("command %q has no \"## %s\" section", path, path)
			continue
		}
		if !strings.Contains(doc, "| `"+path) {
			t.Errorf("command %q is missing from the command table", path)
		}
		own := map[string]bool{}
		c.LocalNonPersistentFlags().VisitAll(func(f *pflag.Flag) {
			if f.Name == "help" {
				return
			}
			own["--"+f.Name] = true
			if !strings.Contains(body, "--"+f.Name) && !tableRowHas(doc, path, "--"+f.Name) {
				t.Errorf("flag --%s of %q is documented neither in its section nor its table row", f.Name, path)
			}
		})
		// Every flag the section or the table row shows must exist.
		shown := body
		for _, line := range strings.Split(doc, "\n") {
			if strings.HasPrefix(line, "| `"+path+" ") || strings.HasPrefix(line, "| `"+path+"`") {
				shown += "\n" + line
			}
		}
		for _, line := range strings.Split(shown, "\n") {
			if !strings.Contains(line, "pegactl") && !strings.HasPrefix(line, "| `"+path) {
				continue
			}
			for _, m := range flagToken.FindAllStringSubmatch(line, -1) {
				if !own[m[1]] && !global[m[1]] {
					t.Errorf("docs show %s on %q, which has no such flag: %s", m[1], path, strings.TrimSpace(line))
				}
			}
		}
	}
	for title := range sections {
		if _, ok := leaves[title]; !ok && !nonCommandSections[title] {
			t.Errorf("docs section %q is not a pegactl command", title)
		}
	}
	for _, code := range []int{ExitOK, ExitError, ExitUsage, ExitNotFound, ExitUnavailable, ExitPermission} {
		if !strings.Contains(sections["Errors and exit codes"], fmt.Sprintf("| %d |", code)) {
			t.Errorf("exit code %d is not in the exit code table", code)
		}
		if !strings.Contains(root.Long, fmt.Sprintf("%d ", code)) {
			t.Errorf("exit code %d is not in pegactl --help", code)
		}
	}
}

// tableRowHas: the command table's row for path shows flag.
func tableRowHas(doc, path, flag string) bool {
	for _, line := range strings.Split(doc, "\n") {
		if strings.HasPrefix(line, "| `"+path) && strings.Contains(line, flag) {
			return true
		}
	}
	return false
}
