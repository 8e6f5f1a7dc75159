// Package verbs is pegad's ibv provider over real libibverbs.
//
// It owns the translation between the ibv model and the C verbs API:
// loading libibverbs at run time (dlopen, as NCCL's ibvwrap does, so a
// binary built here starts on hosts without the library), choosing the port
// and GID a deployment should use, and building work requests and reading
// completions in C memory. It must never hold per-peer or per-block state,
// and never pass Go memory that contains Go pointers to C.
//
// Build: the cgo implementation (linux && cgo && !noverbs) compiles against
// the rdma-core headers carried in include/ (pinned release, see
// include/README.md; no system libibverbs-dev needed) and links only -ldl; ibv_post_send,
// ibv_poll_cq and the port query dispatch through the context's ops (they
// are static inline in verbs.h), every other entry point is resolved with
// dlsym. Any other build (CGO_ENABLED=0, -tags noverbs, non-Linux) compiles
// a stub whose Devices and Open report ibv.ErrUnavailable.
//
// Files without cgo hold the logic that needs no device (errno mapping, MTU
// and attribute building, GID parsing, sysfs reading, port and GID
// selection) so it is unit-tested on every host. fakeverbs.c is a loopback
// stand-in for libibverbs that only tests select, as strict as rdma-core's
// man pages say an mlx5 HCA is: it lets the conformance
// suite exercise the Go/C glue here; TestConformance runs the same suite on
// real devices where they exist. The fake and its controls (FakeLibrary,
// Fake*, SetFakeMWFaults: fake_cgo.go, fakemw_cgo.go) are built only with
// -tags pegad_fakeverbs, as the Makefile's test targets build; a
// production binary has none of them (nofake_cgo.go).
//
// Choices a reader should know: the port is the first ACTIVE one (an
// InfiniBand port needs a LID from the subnet manager; a RoCE port a
// non-zero GID, RoCE v2 and IPv4-mapped preferred); GID types come from
// _ibv_query_gid_ex (ibv_query_gid_type is a private symbol) or sysfs;
// every CQ has its own completion channel, and CQ.Wait busy-polls for
// Options.CQSpin, then arms the CQ and parks on the channel's fd in Go's
// netpoller (no timers: Go fires sub-millisecond ones about 1 ms late).
package verbs
