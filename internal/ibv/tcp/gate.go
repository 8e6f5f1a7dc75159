package tcp

import (
	"github.com/pegaflow/pegad/internal/netgate"
)

// Limits on data connections that have not said hello yet. Anyone who can
// reach the data port can open one, so what it may hold is bounded: a
// goroutine and a hello-sized buffer each (no frame buffer before a valid
// hello), at most netgate.DefaultMaxHalfOpen (512) of them per device and
// netgate.DefaultMaxHalfOpenPerSource (64) per source address, unless
// DeviceOptions say otherwise. A real requester sends its hello right after
// connecting, so when a limit is reached the oldest waiting connection (of
// that source, else of all) is dropped, not the new one: a flood cannot
// lock a real peer out, it can only make it redial (which it does within
// its retry budget). The bookkeeping is a netgate.Gate, as on pegad's other
// ports.

// Reasons of the refused-connections metric.
const (
	refusedSourceLimit = netgate.ReasonSourceLimit // evicted: too many pre-hello connections from its source
	refusedTotalLimit  = netgate.ReasonTotalLimit  // evicted: too many pre-hello connections in all
	refusedBadHello    = "bad_hello"               // first frame not a well-formed hello
	refusedHelloWait   = "hello_timeout"           // no hello within helloTimeout
	refusedRejected    = "rejected"                // well-formed hello refused (no such QP, state, mismatch)
	refusedBadSecret   = "bad_secret"              // hello without the target QP's handshake secret
)

// helloGate tracks the pre-hello connections of one device.
type helloGate = netgate.Gate[*dconn]

// gateEntry is one pre-hello connection's place in its device's helloGate.
type gateEntry = netgate.Entry[*dconn]

func newHelloGate(maxTotal, maxPerSource int) *helloGate {
	return netgate.New[*dconn](maxTotal, maxPerSource)
}
