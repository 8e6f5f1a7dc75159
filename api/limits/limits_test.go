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
		{"binary hash", "n", "\x00\n\xff", ""},
		{"printable unicode namespace", "llama3-70b@tp0/Zürich·模型\uFFFD", "h", ""},
		{"newline in namespace", "ns\nx", "h", "control character (U+000A) at byte 2"},
		{"tab in namespace", "\tns", "h", "control character (U+0009) at byte 0"},
		{"NUL in namespace", "ns\x00", "h", "control character (U+0000)"},
		{"DEL in namespace", "ns\x7f", "h", "control character (U+007F)"},
		{"C1 control in namespace", "ns\u0085", "h", "control character (U+0085)"},
		{"invalid UTF-8 namespace", "ns\xff", "h", "not valid UTF-8 (byte 2)"},
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

func TestValidChain(t *testing.T) {
	many := make([][]byte, MaxBlocksPerRequest+1)
	for i := range many {
		many[i] = []byte{1}
	}
	tests := []struct {
		name   string
		ns     string
		hashes [][]byte
		is     error  // nil accepts
		want   string // a substring of the error
	}{
		{"none", "n", nil, nil, ""},
		{"one", "n", [][]byte{{1}}, nil, ""},
		{"the most", "n", many[:MaxBlocksPerRequest], nil, ""},
		{"one too many", "n", many, ErrTooManyBlocks, "4097 hashes, more than 4096"},
		{"bad namespace first", "", many, ErrInvalidKey, "namespace is empty"},
		{"empty hash named by index", "n", [][]byte{{1}, {}}, ErrInvalidKey, "hash 1: invalid block key: hash is empty"},
		{"long hash", "n", [][]byte{make([]byte, MaxHashLen+1)}, ErrInvalidKey, "hash 0: invalid block key: hash is 65 bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			strs := make([]string, len(tt.hashes))
			for i, h := range tt.hashes {
				strs[i] = string(h)
			}
			for _, err := range []error{ValidChain(tt.ns, tt.hashes), ValidChain(tt.ns, strs)} {
				if tt.is == nil {
					if err != nil {
						t.Fatalf("ValidChain = %v, want nil", err)
					}
					continue
				}
				if !errors.Is(err, tt.is) || !strings.Contains(err.Error(), tt.want) {
					t.Fatalf("ValidChain = %v, want %v with %q", err, tt.is, tt.want)
				}
			}
		})
	}
}
