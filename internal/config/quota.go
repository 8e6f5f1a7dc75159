package config

import (
	"fmt"
	"strings"
)

// NamespaceQuota is one --namespace-quota entry: the most pool bytes the
// namespaces starting with NS may hold together (internal/store's
// quota.go; the longest matching NS wins).
type NamespaceQuota struct {
	NS   string
	Size ByteSize
}

// ParseNamespaceQuota parses one entry, NS=SIZE (SIZE as --pool-size).
func ParseNamespaceQuota(s string) (NamespaceQuota, error) {
	ns, size, ok := strings.Cut(s, "=")
	ns, size = strings.TrimSpace(ns), strings.TrimSpace(size)
	switch {
	case !ok:
		return NamespaceQuota{}, fmt.Errorf("%q is not NS=SIZE", s)
	case ns == "":
		return NamespaceQuota{}, fmt.Errorf("%q has an empty namespace", s)
	}
	n, err := ParseByteSize(size)
	if err != nil {
		return NamespaceQuota{}, fmt.Errorf("%q: %w", s, err)
	}
	if n == 0 {
		return NamespaceQuota{}, fmt.Errorf("%q: a quota of 0 bytes", s)
	}
	return NamespaceQuota{NS: ns, Size: n}, nil
}

// NamespaceQuotas is the namespace-quota key parsed, in the order given.
// Validate refuses what does not parse, so after Load it cannot fail.
func (c *Config) NamespaceQuotas() ([]NamespaceQuota, error) {
	var out []NamespaceQuota
	seen := map[string]bool{}
	for _, e := range c.NamespaceQuota {
		q, err := ParseNamespaceQuota(e)
		if err != nil {
			return nil, err
		}
		if seen[q.NS] {
			return nil, fmt.Errorf("namespace %q is given twice", q.NS)
		}
		seen[q.NS] = true
		out = append(out, q)
	}
	return out, nil
}

func (c *Config) validateQuotas(bad badFunc) {
	if _, err := c.NamespaceQuotas(); err != nil {
		bad("namespace-quota", "%v", err)
	}
}
