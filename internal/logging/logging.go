// Package logging builds pegad's zerolog logger from the log-level and
// log-format settings, and rate-limits lines the network can repeat
// (Limiter). It owns only logger construction and those limiters; it must
// never hold global state beyond zerolog's own time-field configuration.
package logging

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/mattn/go-isatty"
	"github.com/rs/zerolog"
)

// Formats accepted by New.
const (
	FormatJSON    = "json"
	FormatConsole = "console"
	// FormatAuto is console on a terminal, json otherwise (journald, files).
	FormatAuto = "auto"
)

// ParseLevel accepts trace, debug, info, warn, error (case-insensitive).
func ParseLevel(s string) (zerolog.Level, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "trace":
		return zerolog.TraceLevel, nil
	case "debug":
		return zerolog.DebugLevel, nil
	case "info", "":
		return zerolog.InfoLevel, nil
	case "warn", "warning":
		return zerolog.WarnLevel, nil
	case "error":
		return zerolog.ErrorLevel, nil
	}
	return zerolog.NoLevel, fmt.Errorf("unknown log level %q (want trace|debug|info|warn|error)", s)
}

// ValidFormat reports whether f is a known format.
func ValidFormat(f string) bool {
	switch f {
	case FormatJSON, FormatConsole, FormatAuto:
		return true
	}
	return false
}

// New returns a logger writing to w (os.Stderr when nil) at level, in format.
func New(w io.Writer, level, format string) (zerolog.Logger, error) {
	lvl, err := ParseLevel(level)
	if err != nil {
		return zerolog.Nop(), err
	}
	if w == nil {
		w = os.Stderr
	}
	if !ValidFormat(format) {
		return zerolog.Nop(), fmt.Errorf("unknown log format %q (want json|console|auto)", format)
	}
	if format == FormatAuto {
		format = FormatJSON
		if f, ok := w.(*os.File); ok && isatty.IsTerminal(f.Fd()) {
			format = FormatConsole
		}
	}
	zerolog.TimeFieldFormat = time.RFC3339Nano
	// Durations (age, took, budget, ...) are logged as float seconds, the
	// unit Prometheus and operators use; zerolog's default is milliseconds
	// under unit-less keys.
	zerolog.DurationFieldUnit = time.Second
	zerolog.DurationFieldInteger = false
	if format == FormatConsole {
		w = zerolog.ConsoleWriter{Out: w, TimeFormat: "15:04:05.000"}
	}
	return zerolog.New(w).Level(lvl).With().Timestamp().Logger(), nil
}
