//go:build linux && cgo && !noverbs && !pegad_fakeverbs

package verbs

// A production build: no fake HCA (fakeverbs.c and its controls are in
// fake_cgo.go, built only with -tags pegad_fakeverbs). Every library name
// is dlopen'ed, FakeLibrary's included, which no host has.

// fakeBuilt says this build has the fake HCA.
const fakeBuilt = false

// fakeLib is nil: this build has no fake.
func fakeLib(string) *lib { return nil }
