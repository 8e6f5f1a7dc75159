package localwire

import (
	"errors"
	"reflect"
	"testing"
)

func TestHelloReplyParts(t *testing.T) {
	const size = 1 << 20
	ok := []Part{{0, 0, size / 2}, {1, size / 2, size / 2}}
	for _, tc := range []struct {
		name  string
		parts []Part
		ok    bool
	}{
		{"two nodes", ok, true},
		{"unbound", []Part{{NoNode, 0, size}}, true},
		{"none", nil, false},
		{"gap", []Part{{0, 0, size / 2}, {1, size/2 + 64, size/2 - 64}}, false},
		{"short", []Part{{0, 0, size / 2}}, false},
		{"past the end", []Part{{0, 0, size / 2}, {1, size / 2, size}}, false},
		{"empty part", []Part{{0, 0, 0}, {1, 0, size}}, false},
		{"bad node", []Part{{-2, 0, size}}, false},
		{"node too large", []Part{{MaxNode + 1, 0, size}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := HelloReply{Version: 4, PoolSize: size, LeaseTimeout: 5, Parts: tc.parts}
			got, err := DecodeHelloReply(AppendHelloReply(nil, in))
			if !tc.ok {
				if !errors.Is(err, ErrMalformed) {
					t.Fatalf("decoded %+v, err %v; want ErrMalformed", got, err)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, in) {
				t.Fatalf("got %+v, %v; want %+v", got, err, in)
			}
		})
	}
	// Version 3 has no parts: the reply is the 20 bytes it always was.
	if b := AppendHelloReply(nil, HelloReply{Version: 3, PoolSize: size, Parts: ok}); len(b) != 20 {
		t.Fatalf("version 3 reply of %d bytes", len(b))
	}
}

func TestAllocOnItems(t *testing.T) {
	in := []AllocOnItem{
		{Node: 1, AllocItem: AllocItem{Key: Key{"ns", []byte{1}}, Slots: []SlotSize{{4, 4}}}},
		{Node: NoNode, AllocItem: AllocItem{Key: Key{"ns", []byte{2}}, Slots: []SlotSize{{8, 0}}}},
	}
	var b []byte
	for _, it := range in {
		b = AppendAllocOnItem(b, it)
	}
	got, err := DecodeAllocOnItems(b, len(in))
	if err != nil || !reflect.DeepEqual(got, in) {
		t.Fatalf("got %+v, %v", got, err)
	}
	if _, err := DecodeAllocOnItems(b[:3], 1); !errors.Is(err, ErrMalformed) {
		t.Fatalf("truncated node: %v", err)
	}
	if MinVersionOf(OpAllocOn) != 4 || OpAllocOn.String() != "alloc_on" {
		t.Fatalf("alloc_on: version %d, %q", MinVersionOf(OpAllocOn), OpAllocOn)
	}
}
