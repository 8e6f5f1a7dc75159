package store

import (
	"fmt"

	"github.com/pegaflow/pegad/api/limits"
)

// A CheckedKey is a Key that passed CheckKey. The store's writers that
// take one (PutChecked, InsertChecked) trust it; Put, Insert and
// InsertFetched check their Key themselves. So a front end that must
// refuse a bad key before it takes a block's bytes or a lease (localapi's
// PutBlock, localdata's ALLOC and PUT) checks it once, in its protocol's
// words, and the store does not check it again. The zero CheckedKey was
// never checked: the writers refuse it.
type CheckedKey struct{ k Key }

// CheckKey checks k against limits.ValidKey. Its error is limits' own (it
// wraps limits.ErrInvalidKey), for the caller to put in its protocol's
// refusal; the store's own writers wrap it in ErrInvalid as well.
func CheckKey(k Key) (CheckedKey, error) {
	if err := limits.ValidKey(k.Namespace, k.Hash); err != nil {
		return CheckedKey{}, err
	}
	return CheckedKey{k: k}, nil
}

// Key is the key that was checked.
func (c CheckedKey) Key() Key { return c.k }

// InsertChecked is Insert of a key its caller has checked already.
func (s *Store) InsertChecked(key CheckedKey, e *Extent, slots []SlotLayout) (created bool, err error) {
	return s.insert(key, e, slots, false, nil)
}

// PutChecked is Put of a key its caller has checked already.
func (s *Store) PutChecked(key CheckedKey, sizes []SlotSize, fill func(buf []byte) error) (created bool, err error) {
	return s.put(key, sizes, fill, nil)
}

// checkKey is CheckKey for the store's own writers: the error wraps both
// ErrInvalid and limits.ErrInvalidKey.
func checkKey(k Key) (CheckedKey, error) {
	c, err := CheckKey(k)
	if err != nil {
		return CheckedKey{}, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return c, nil
}

// errUnchecked refuses a zero CheckedKey (a valid namespace is never empty).
var errUnchecked = fmt.Errorf("%w: key was not checked (store.CheckKey)", ErrInvalid)

func (c CheckedKey) checked() bool { return c.k.Namespace != "" }
