package limits

import (
	"errors"
	"strings"
	"testing"
)

func TestValidKey(t *testing.T) {
	tests := []struct {
		name, ns, hash string
		want           string // "" accepts; else a substring of the error
	}{
		{"smallest", "n", "h", ""},
		{"largest", strings.Repeat("n", MaxNamespaceLen), strings.Repeat("h", MaxHashLen), ""},
		{"empty namespace", "", "h", "namespace is empty"},
		{"long namespace", strings.Repeat("n", MaxNamespaceLen+1), "h", "namespace is 257 bytes"},
		{"empty hash", "n", "", "hash is empty"},
		{"long hash", "n", strings.Repeat("h", MaxHashLen+1), "hash is 65 bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, err := range []error{ValidKey(tt.ns, tt.hash), ValidKey(tt.ns, []byte(tt.hash))} {
				if tt.want == "" {
					if err != nil {
						t.Fatalf("ValidKey(%d, %d bytes) = %v, want nil", len(tt.ns), len(tt.hash), err)
					}
					continue
				}
				if !errors.Is(err, ErrInvalidKey) || !strings.Contains(err.Error(), tt.want) {
					t.Fatalf("ValidKey(%d, %d bytes) = %v, want ErrInvalidKey with %q", len(tt.ns), len(tt.hash), err, tt.want)
				}
			}
		})
	}
}
