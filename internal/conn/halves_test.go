package conn

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

const connPath = "github.com/pegaflow/pegad/internal/conn"

// halfNames are the names of one half of the package, which the other
// half's user must not name.
var (
	dialerNames   = []string{"Dialer", "DialerOptions", "NewDialer"}
	acceptorNames = []string{"Acceptor", "AcceptorOptions", "NewAcceptor"}
)

// TestHalvesUsedApart keeps the package comment's rule true: the
// requester's production files name only the Dialer's half, the holder's
// only the Acceptor's (today none of conn: it states what it needs of the
// Acceptor as interfaces, and the daemon makes both halves).
func TestHalvesUsedApart(t *testing.T) {
	tests := []struct {
		dir       string
		forbidden []string
		uses      bool // names something of conn: else the check is vacuous
	}{
		{"../requester", acceptorNames, true},
		{"../holder", dialerNames, false},
	}
	for _, tt := range tests {
		t.Run(filepath.Base(tt.dir), func(t *testing.T) {
			uses := connNames(t, tt.dir)
			if tt.uses && len(uses) == 0 {
				t.Fatalf("%s names nothing of conn: the check would pass vacuously", tt.dir)
			}
			for _, use := range uses {
				for _, name := range tt.forbidden {
					if use.name == name {
						t.Errorf("%s names conn.%s, of the other half", use.pos, name)
					}
				}
			}
		})
	}
}

type connUse struct{ pos, name string }

// connNames lists every conn.X that dir's non-test files name, under
// whatever name they import conn as.
func connNames(t *testing.T, dir string) []connUse {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no Go files in %s (%v)", dir, err)
	}
	var uses []connUse
	fset := token.NewFileSet()
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		af, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		local := ""
		for _, imp := range af.Imports {
			if p, _ := strconv.Unquote(imp.Path.Value); p == connPath {
				local = "conn"
				if imp.Name != nil {
					local = imp.Name.Name
				}
			}
		}
		if local == "" {
			continue
		}
		ast.Inspect(af, func(n ast.Node) bool {
			if sel, ok := n.(*ast.SelectorExpr); ok {
				if id, ok := sel.X.(*ast.Ident); ok && id.Name == local {
					uses = append(uses, connUse{pos: fset.Position(sel.Pos()).String(), name: sel.Sel.Name})
				}
			}
			return true
		})
	}
	return uses
}
