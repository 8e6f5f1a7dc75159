package peertls

import (
	"strings"
	"testing"
)

func TestGlob(t *testing.T) {
	for _, c := range []struct {
		p, s string
		want bool
	}{
		{"a", "a", true},
		{"a", "b", false},
		{"*", "", true},
		{"*", "anything/at.all", true},
		{"*.pegad.internal", "gpu1.pegad.internal", true},
		{"*.pegad.internal", "pegad.internal", false},
		{"*.pegad.internal", "gpu1.pegad.internal.evil", false},
		{"spiffe://cluster/ns/*/sa/pegad", "spiffe://cluster/ns/kv/sa/pegad", true},
		{"spiffe://cluster/ns/*/sa/pegad", "spiffe://cluster/ns/kv/sa/other", false},
		{"gpu*-*", "gpu12-a", true},
		{"gpu*-*", "gpu12a", false},
		{"a*a*a*a*b", strings.Repeat("a", 200), false},
	} {
		if got := glob(c.p, c.s); got != c.want {
			t.Errorf("glob(%q, %q) = %v, want %v", c.p, c.s, got, c.want)
		}
	}
}
