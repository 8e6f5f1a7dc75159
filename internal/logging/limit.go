package logging

import (
	"sync"
	"time"
)

// Limiter rate-limits one repeated log line that anyone can cause (a
// malformed request from the network): the first is logged, then at most
// one per interval, each saying how many were suppressed since the one
// before. It drops lines, never counts: keep a metric of every occurrence.
// Safe for concurrent use.
type Limiter struct {
	every time.Duration // immutable
	now   func() time.Time

	mu         sync.Mutex // guards last, logged, suppressed
	last       time.Time  // when a line was last let through
	logged     bool       // one has been
	suppressed uint64     // lines dropped since last
}

// NewLimiter lets a line through at most once every interval.
func NewLimiter(every time.Duration) *Limiter {
	return &Limiter{every: every, now: time.Now}
}

// Allow reports whether to log this occurrence and, when it does, how many
// were suppressed since the last one logged (for a "suppressed" field).
func (l *Limiter) Allow() (ok bool, suppressed uint64) {
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.logged && now.Sub(l.last) < l.every {
		l.suppressed++
		return false, 0
	}
	l.logged, l.last = true, now
	suppressed, l.suppressed = l.suppressed, 0
	return true, suppressed
}
