// Package bench holds the paired benchmarks `make bench` runs: each one
// measures a pegad path (the subject) and, in the same iterations, a
// baseline doing the same work with nothing of pegad in the way (a bare
// gRPC echo, a plain TCP or unix stream moving the same bytes), and reports
// both so their ratio can be quoted. Absolute figures on a shared machine
// are noise; the ratio of two figures measured side by side is not.
//
// It has no non-test code: everything is in *_test.go files. It must never
// reach beyond loopback, and uses only the exported API of the packages it
// measures (so it does not break when their internals change).
//
// Conventions, parsed by scripts/bench.sh: every paired benchmark reports
// its subject and its baseline with b.ReportMetric under the units
// "<what>-MB/s" (higher is better) or "<what>-ns/op" (lower is better),
// and the ratio subject/baseline under "ratio" (or "<what>-ratio").
package bench
