// Package reliability is pegad's reliability suite, modelled on etcd's
// robustness tests: real pegad processes (pegad built once per run into a temporary directory),
// each in its own network namespace joined by veth pairs to a bridge, traffic
// from real clients (the local gRPC API over each daemon's unix socket, and
// raw peer connections), faults injected while the traffic runs (kill -9,
// link cuts, loss, slow links, floods, hostile bytes), and a validator that
// checks the recorded history and every daemon's metrics afterwards.
//
// All of it lives in _test.go files: `make test` runs the short form (a few
// scenarios on loopback, no namespaces); `make reliability` sets
// PEGAD_RELIABILITY=1 and runs the whole table (root and netns needed, else
// it prints a skip line and passes). See docs/reliability.md.
//
// It must never touch an address outside loopback and the namespaces it
// creates (named rl<pid>-<random>-*, removed at cleanup and swept at start
// when their creator is gone), and never change daemon code or state other
// than through the daemons' public interfaces.
package reliability
