package store

import (
	"errors"
	"strings"
	"testing"

	"github.com/pegaflow/pegad/api/limits"
)

// TestCheckedKey: CheckKey refuses what limits.ValidKey refuses, with
// limits' own error (front ends word their refusals with it); the
// store's writers that check for themselves wrap it in ErrInvalid too;
// and the writers that trust a CheckedKey refuse one that was never
// checked, storing nothing.
func TestCheckedKey(t *testing.T) {
	s, _ := newStore(t, 64*kib)
	fill := func([]byte) error { return nil }
	sizes := []SlotSize{{KSize: 100}}
	bad := []struct {
		name string
		k    Key
		want string
	}{
		{"empty namespace", Key{Hash: "h"}, "namespace is empty"},
		{"control character", Key{Namespace: "ns\nx", Hash: "h"}, "control character (U+000A)"},
		{"empty hash", Key{Namespace: "ns"}, "hash is empty"},
		{"long hash", Key{Namespace: "ns", Hash: strings.Repeat("h", limits.MaxHashLen+1)}, "hash is 65 bytes"},
	}
	for _, tt := range bad {
		t.Run(tt.name, func(t *testing.T) {
			_, err := CheckKey(tt.k)
			want := limits.ValidKey(tt.k.Namespace, tt.k.Hash)
			if err == nil || want == nil || err.Error() != want.Error() || errors.Is(err, ErrInvalid) {
				t.Fatalf("CheckKey = %v, want limits' own %v (not ErrInvalid)", err, want)
			}
			if _, err := s.Put(tt.k, sizes, fill); !errors.Is(err, ErrInvalid) || !errors.Is(err, limits.ErrInvalidKey) ||
				!strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Put = %v, want ErrInvalid and ErrInvalidKey naming %q", err, tt.want)
			}
		})
	}

	e, err := s.AllocExtent(100)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.ReleaseExtent(e) })
	before := s.Stats()
	if _, err := s.PutChecked(CheckedKey{}, sizes, fill); !errors.Is(err, ErrInvalid) {
		t.Fatalf("PutChecked(zero) = %v, want ErrInvalid", err)
	}
	if _, err := s.InsertChecked(CheckedKey{}, e, []SlotLayout{{KLen: 100}}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("InsertChecked(zero) = %v, want ErrInvalid", err)
	}
	if after := s.Stats(); after != before {
		t.Fatalf("an unchecked key changed the store: %+v, then %+v", before, after)
	}

	ck, err := CheckKey(key(1))
	if err != nil || ck.Key() != key(1) {
		t.Fatalf("CheckKey(%v) = %v, %v", key(1), ck.Key(), err)
	}
	if created, err := s.PutChecked(ck, sizes, fill); err != nil || !created || !s.Has(key(1)) {
		t.Fatalf("PutChecked = %v, %v; want the block stored", created, err)
	}
	ck2, _ := CheckKey(key(2))
	if created, err := s.InsertChecked(ck2, e, []SlotLayout{{KLen: 100}}); err != nil || !created || !s.Has(key(2)) {
		t.Fatalf("InsertChecked = %v, %v; want the block stored", created, err)
	}
}
