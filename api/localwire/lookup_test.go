package localwire

import (
	"bytes"
	"errors"
	"fmt"
	"testing"
)

// TestDecodeChainIntoReuses: decoding one chain after another into the
// same Chain allocates nothing once its slice is long enough (a daemon's
// connection decodes every LOOKUP so), and gives the same chain as
// DecodeChain; a malformed body leaves no hashes behind.
func TestDecodeChainIntoReuses(t *testing.T) {
	hs := make([][]byte, 1000)
	for i := range hs {
		hs[i] = fmt.Appendf(nil, "%032x", i)
	}
	body := AppendChain(nil, Chain{Namespace: "m@tp0", Hashes: hs})
	var c Chain
	if err := DecodeChainInto(&c, body, 1); err != nil {
		t.Fatal(err)
	}
	if a := testing.AllocsPerRun(50, func() {
		if err := DecodeChainInto(&c, body, 1); err != nil {
			t.Fatal(err)
		}
	}); a != 0 {
		t.Fatalf("%.1f allocations per decode into a reused chain, want 0", a)
	}
	want, err := DecodeChain(body, 1)
	if err != nil || c.Namespace != want.Namespace || len(c.Hashes) != len(want.Hashes) {
		t.Fatalf("decoded %q/%d, DecodeChain %q/%d (%v)", c.Namespace, len(c.Hashes), want.Namespace, len(want.Hashes), err)
	}
	for i := range hs {
		if !bytes.Equal(c.Hashes[i], hs[i]) {
			t.Fatalf("hash %d = %q, want %q", i, c.Hashes[i], hs[i])
		}
	}
	short := AppendChain(nil, Chain{Namespace: "other", Hashes: hs[:3]})
	if err := DecodeChainInto(&c, short, 1); err != nil || c.Namespace != "other" || len(c.Hashes) != 3 {
		t.Fatalf("a shorter chain of another namespace: %q/%d, %v", c.Namespace, len(c.Hashes), err)
	}
	if err := DecodeChainInto(&c, body[:len(body)-1], 1); !errors.Is(err, ErrMalformed) || len(c.Hashes) != 0 {
		t.Fatalf("a truncated body: %v, %d hashes left", err, len(c.Hashes))
	}
}
