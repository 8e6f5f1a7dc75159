package logging

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/rs/zerolog"
)

func TestParseLevel(t *testing.T) {
	for in, want := range map[string]zerolog.Level{
		"trace": zerolog.TraceLevel, "DEBUG": zerolog.DebugLevel, "info": zerolog.InfoLevel, "": zerolog.InfoLevel,
		"warn": zerolog.WarnLevel, "warning": zerolog.WarnLevel, "error": zerolog.ErrorLevel,
	} {
		if got, err := ParseLevel(in); err != nil || got != want {
			t.Errorf("ParseLevel(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	if _, err := ParseLevel("loud"); err == nil {
		t.Error("ParseLevel(loud) accepted")
	}
}

func TestNew(t *testing.T) {
	var b bytes.Buffer
	l, err := New(&b, "warn", FormatJSON)
	if err != nil {
		t.Fatal(err)
	}
	l.Info().Msg("dropped")
	l.Warn().Str("session", "s1").Msg("kept")
	var m map[string]any
	if err := json.Unmarshal(b.Bytes(), &m); err != nil {
		t.Fatalf("json line: %v (%q)", err, b.String())
	}
	if m["message"] != "kept" || m["session"] != "s1" || m["time"] == nil {
		t.Fatalf("line %v", m)
	}

	b.Reset()
	// auto on a non-terminal writer is json.
	l, _ = New(&b, "info", FormatAuto)
	l.Info().Msg("x")
	if !strings.HasPrefix(b.String(), "{") {
		t.Fatalf("auto on a buffer: %q", b.String())
	}
	b.Reset()
	l, _ = New(&b, "info", FormatConsole)
	l.Info().Msg("hello")
	if strings.HasPrefix(b.String(), "{") || !strings.Contains(b.String(), "hello") {
		t.Fatalf("console: %q", b.String())
	}
	if _, err := New(&b, "info", "xml"); err == nil {
		t.Fatal("format xml accepted")
	}
}
