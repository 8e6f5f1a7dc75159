// Package limits owns the bounds pegad's protocols share: how many blocks
// one request may name, how long a block key's namespace and hash may be,
// and how many QPs and NICs one peer connection may use. Every layer that
// checks one of them (the wire codecs, the gRPC servers, the store, the
// config and pegactl) takes it from here, so a limit changes in one place.
//
// It holds constants and the key validators only: it must never import
// anything of pegad's, so api/ and client/ can depend on it, and it must
// never decide what a caller does with a refusal (a gRPC code, an exit
// status); callers wrap ErrInvalidKey in their own error.
package limits

import (
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

const (
	// MaxBlocksPerRequest is the most blocks (hashes) one request names:
	// a prefetch, a peer query, a cluster lookup, one local-protocol frame,
	// one page of a list.
	MaxBlocksPerRequest = 4096
	// MaxNamespaceLen and MaxHashLen bound a block key: a namespace is
	// 1..256 bytes and a hash 1..64 bytes.
	MaxNamespaceLen = 256
	MaxHashLen      = 64
	// MaxQPsPerPeer bounds the queue pairs one peer connection uses, and
	// so what a handshake may ask a holder to create.
	MaxQPsPerPeer = 64
	// MaxNICs bounds the NICs one node uses and one handshake names.
	MaxNICs = 64
)

// ErrInvalidKey is what ValidKey's errors wrap.
var ErrInvalidKey = errors.New("invalid block key")

// ErrTooManyBlocks is what ValidChain's error wraps for a request naming
// more than MaxBlocksPerRequest hashes.
var ErrTooManyBlocks = errors.New("too many blocks in one request")

// ValidChain checks a request that names one namespace and several hashes
// (a prefetch, a lock query, a lookup, a locate): the namespace, at most
// MaxBlocksPerRequest hashes, and each hash, in that order. A hash's error
// names its index ("hash 3: ..."). An empty chain passes: whether a
// request may name no hash is the caller's to say. Errors wrap
// ErrInvalidKey or ErrTooManyBlocks.
func ValidChain[H ~string | ~[]byte](ns string, hashes []H) error {
	if err := ValidNamespace(ns); err != nil {
		return err
	}
	if len(hashes) > MaxBlocksPerRequest {
		return fmt.Errorf("%w: %d hashes, more than %d", ErrTooManyBlocks, len(hashes), MaxBlocksPerRequest)
	}
	// The bounds are checked inline and ValidHash only words a refusal: a
	// call per hash was most of a 1,000-hash LOOKUP's validation.
	for i, h := range hashes {
		if n := len(h); n == 0 || n > MaxHashLen {
			return fmt.Errorf("hash %d: %w", i, ValidHash(h))
		}
	}
	return nil
}

// ValidKey checks a namespace and a hash against the key bounds. Its error
// wraps ErrInvalidKey and says which part is wrong and how long it was.
func ValidKey[H ~string | ~[]byte](ns string, hash H) error {
	if err := ValidNamespace(ns); err != nil {
		return err
	}
	return ValidHash(hash)
}

// ValidNamespace is ValidKey's namespace half, for a request that names
// one namespace and many hashes.
//
// A namespace is printed (pegactl's tables, logs, KV-events topics) and
// sent as a protobuf string, so beyond its length it must be valid UTF-8
// (gRPC could not carry it, and a block put over the data socket could
// then never be listed) and hold no control character (a newline or a tab
// breaks every table and log line it is printed in).
func ValidNamespace(ns string) error {
	switch {
	case ns == "":
		return fmt.Errorf("%w: namespace is empty", ErrInvalidKey)
	case len(ns) > MaxNamespaceLen:
		return fmt.Errorf("%w: namespace is %d bytes, more than %d", ErrInvalidKey, len(ns), MaxNamespaceLen)
	}
	for i, r := range ns {
		switch {
		case r == utf8.RuneError && !strings.HasPrefix(ns[i:], string(utf8.RuneError)):
			return fmt.Errorf("%w: namespace is not valid UTF-8 (byte %d)", ErrInvalidKey, i)
		case unicode.IsControl(r):
			return fmt.Errorf("%w: namespace has a control character (%U) at byte %d", ErrInvalidKey, r, i)
		}
	}
	return nil
}

// ValidHash is ValidKey's hash half.
func ValidHash[H ~string | ~[]byte](hash H) error {
	switch {
	case len(hash) == 0:
		return fmt.Errorf("%w: hash is empty", ErrInvalidKey)
	case len(hash) > MaxHashLen:
		return fmt.Errorf("%w: hash is %d bytes, more than %d", ErrInvalidKey, len(hash), MaxHashLen)
	}
	return nil
}
