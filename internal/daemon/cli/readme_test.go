package cli

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

// readmeFlagRow is a row of README.md's serve flag table: its flag cell
// (one or more `--flag`s) and its default cell.
var readmeFlagRow = regexp.MustCompile("^\\| (`--[a-z0-9-]+`(?:, `--[a-z0-9-]+`)*) \\| ([^|]*) \\|")

// TestReadmeFlagTable (issue 33 item 10): README.md's table under "Every
// flag" names exactly the flags `pegad serve --help` shows, and where a
// row gives one flag a literal default (`info`), it is the flag's own.
// Before it nothing read the README: TestExampleConfig holds
// configs/pegad.yaml to the settings and TestDocsMatchCLI holds
// docs/pegactl.md to pegactl, so a new flag (--eviction) could miss the
// table its first reader uses.
func TestReadmeFlagTable(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join("..", "..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, table, ok := strings.Cut(string(readme), "`pegad` without a subcommand runs `serve`. Every flag:")
	if !ok {
		t.Fatal(`README.md has no "Every flag:" table`)
	}
	table, _, _ = strings.Cut(table, "\n#")
	documented := map[string]string{} // flag → its row's default cell
	for _, line := range strings.Split(table, "\n") {
		row := readmeFlagRow.FindStringSubmatch(line)
		if row == nil {
			continue
		}
		names := strings.Split(row[1], ", ")
		for _, n := range names {
			name := strings.TrimPrefix(strings.Trim(n, "`"), "--")
			if _, dup := documented[name]; dup {
				t.Errorf("README lists --%s twice", name)
			}
			documented[name] = ""
			if len(names) == 1 {
				documented[name] = strings.TrimSpace(row[2])
			}
		}
	}
	serve := newServeCommand()
	var shown []string
	serve.Flags().VisitAll(func(f *pflag.Flag) {
		if f.Hidden {
			return
		}
		shown = append(shown, f.Name)
		def, ok := documented[f.Name]
		switch {
		case !ok:
			t.Errorf("serve --help has --%s; README.md's flag table lacks it", f.Name)
		case !sameDefault(f, def):
			t.Errorf("README.md: --%s defaults to %s; serve --help says %q", f.Name, def, f.DefValue)
		}
	})
	for name := range documented {
		if !slices.Contains(shown, name) {
			t.Errorf("README.md's flag table lists --%s; serve --help has no such flag", name)
		}
	}
}

// sameDefault reports whether a README default cell agrees with f's
// default. Only a cell that is one literal (`120s`) is compared: prose
// ("hostname", "pool-size / 2", "– (off)") says what the flag's empty
// default means.
func sameDefault(f *pflag.Flag, cell string) bool {
	lit, ok := strings.CutPrefix(cell, "`")
	if !ok || !strings.HasSuffix(lit, "`") || strings.Count(cell, "`") != 2 {
		return true
	}
	lit = strings.TrimSuffix(lit, "`")
	if f.Value.Type() == "duration" {
		a, errA := time.ParseDuration(lit)
		b, errB := time.ParseDuration(f.DefValue)
		return errA == nil && errB == nil && a == b
	}
	return lit == f.DefValue
}
