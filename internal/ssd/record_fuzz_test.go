package ssd

import (
	"testing"

	"github.com/pegaflow/pegad/internal/store"
)

// FuzzDecodeHeader feeds decodeHeader bytes as they could sit on disk
// (stale pages, torn or crafted headers): it must never panic, and what it
// accepts must be a header the tier can act on: a page-aligned length
// within the bytes it was given or asked for, slot sizes each within a
// block's limit that sum to the data length exactly.
func FuzzDecodeHeader(f *testing.F) {
	k := store.Key{Namespace: "ns", Hash: "h00001"}
	for _, sz := range [][]store.SlotSize{{{KSize: 8, VSize: 24}}, {{KSize: 1, VSize: 1}, {KSize: 2, VSize: 2}}} {
		var total uint64
		for _, s := range sz {
			total += s.KSize + s.VSize
		}
		rec := make([]byte, headerLen(k, len(sz))+alignUp(total))
		encodeHeader(rec, 3, 1, k, sz, total)
		f.Add(rec)
	}
	f.Add(make([]byte, Align))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, need, err := decodeHeader(b)
		if err != nil || need > 0 {
			return
		}
		if h.hdrLen%Align != 0 || uint64(h.hdrLen) > uint64(len(b)) {
			t.Fatalf("accepted header length %d of %d bytes", h.hdrLen, len(b))
		}
		var total uint64
		for _, s := range h.sizes {
			if s.KSize > store.MaxBlockLen || s.VSize > store.MaxBlockLen {
				t.Fatalf("accepted slot size %+v over the block limit", s)
			}
			total += s.KSize + s.VSize
		}
		if !h.tomb && total != h.dataLen {
			t.Fatalf("slot sizes sum to %d, data length %d", total, h.dataLen)
		}
	})
}
