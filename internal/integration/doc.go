// Package integration holds end-to-end tests of whole pegad daemons wired
// together in one process over the tcp transport: loopback ports, sockets in
// temporary directories, faults injected through the daemon's test options.
//
// It has no production code and must never be imported: everything here is
// in _test.go files, except this comment.
package integration
