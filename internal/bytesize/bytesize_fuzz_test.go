package bytesize

import "testing"

// FuzzParse: any input parses or errors without panicking, and a
// parsed size survives String → Parse unchanged.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"256MiB", "1GiB", "512M", "4096", "1.5GiB", " 8 kib ", "", "-1", "1e9", "18446744073709551615", "17179869184TiB", ".", "1..2M"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		b, err := Parse(s)
		if err != nil {
			return
		}
		back, err := Parse(b.String())
		if err != nil || back != b {
			t.Fatalf("%q → %d → %q → %d, %v", s, b, b.String(), back, err)
		}
	})
}
