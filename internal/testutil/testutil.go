// Package testutil holds helpers shared by pegad's tests. Only _test.go
// files import it; it must never hold state across tests.
package testutil

import (
	"bytes"
	"sync"
)

// LogBuffer is a log sink that tests read while daemons and workers write
// to it from other goroutines.
type LogBuffer struct {
	mu sync.Mutex // guards b
	b  bytes.Buffer
}

func (s *LogBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String returns everything written so far.
func (s *LogBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Bytes returns a copy of everything written so far.
func (s *LogBuffer) Bytes() []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return bytes.Clone(s.b.Bytes())
}
