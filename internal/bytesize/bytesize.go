// Package bytesize owns the notation for a number of bytes that operators
// type in flags and YAML ("256MiB", "512M", "4096"). It parses and formats
// sizes and nothing else: it must never import a flag or config library,
// so pegactl can use it without pulling in pegad's config stack.
package bytesize

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"unicode"
)

// Size is a number of bytes that decodes from "256MiB", "1GiB", "512M",
// "4096" or a plain integer. Binary (KiB, MiB, GiB, TiB) and decimal-looking
// (K, M, G, T, KB, MB, GB, TB) suffixes are both powers of 1024: memory sizes
// are always meant in binary units here, and "512M" meaning 512 MiB is what
// operators coming from ulimit/Java/Kubernetes-style flags expect.
type Size uint64

var sizeUnits = map[string]uint64{
	"": 1, "b": 1,
	"k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10,
	"m": 1 << 20, "mb": 1 << 20, "mib": 1 << 20,
	"g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30,
	"t": 1 << 40, "tb": 1 << 40, "tib": 1 << 40,
}

// Parse parses s (see Size). Fractions ("1.5GiB") are allowed
// and rounded down to a whole byte.
func Parse(s string) (Size, error) {
	t := strings.TrimSpace(s)
	if t == "" {
		return 0, fmt.Errorf("empty size")
	}
	i := strings.IndexFunc(t, func(r rune) bool { return !(unicode.IsDigit(r) || r == '.') })
	num, unit := t, ""
	if i >= 0 {
		num, unit = t[:i], strings.TrimSpace(t[i:])
	}
	mult, ok := sizeUnits[strings.ToLower(unit)]
	if !ok {
		return 0, fmt.Errorf("invalid size %q: unknown unit %q (use B, KiB, MiB, GiB, TiB)", s, unit)
	}
	if num == "" {
		return 0, fmt.Errorf("invalid size %q: no number", s)
	}
	if !strings.Contains(num, ".") {
		n, err := strconv.ParseUint(num, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("invalid size %q: %w", s, err)
		}
		if n > math.MaxUint64/mult {
			return 0, fmt.Errorf("invalid size %q: overflows 64 bits", s)
		}
		return Size(n * mult), nil
	}
	f, err := strconv.ParseFloat(num, 64)
	if err != nil {
		return 0, fmt.Errorf("invalid size %q: %w", s, err)
	}
	v := f * float64(mult)
	if v >= math.MaxUint64 {
		return 0, fmt.Errorf("invalid size %q: overflows 64 bits", s)
	}
	return Size(v), nil
}

// String formats b in the largest binary unit that divides it exactly.
func (b Size) String() string {
	n := uint64(b)
	for _, u := range []struct {
		name string
		mult uint64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n >= u.mult && n%u.mult == 0 {
			return strconv.FormatUint(n/u.mult, 10) + u.name
		}
	}
	return strconv.FormatUint(n, 10)
}
