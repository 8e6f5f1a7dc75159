package client_test

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"
)

// TestImportsOnlyPublicPackages: the client (and the wire format it speaks)
// must build in an engine's tree, so their non-test files import nothing
// of pegad's internal packages.
func TestImportsOnlyPublicPackages(t *testing.T) {
	for _, dir := range []string{".", "../api/localwire"} {
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			af, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.ImportsOnly)
			if err != nil {
				t.Fatal(err)
			}
			for _, imp := range af.Imports {
				p := strings.Trim(imp.Path.Value, `"`)
				if strings.HasPrefix(p, "github.com/pegaflow/pegad/") && !strings.HasPrefix(p, "github.com/pegaflow/pegad/api/") {
					t.Errorf("%s imports %s: only pegad's api/ packages are allowed", f, p)
				}
			}
		}
	}
}
