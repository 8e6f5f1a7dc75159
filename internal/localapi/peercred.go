package localapi

import (
	"context"
	"fmt"
	"net"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
)

// PeerCred is the kernel's word on who is on the other end of the unix
// socket (SO_PEERCRED), attached to every RPC as its peer's AuthInfo. The
// admin API logs it next to the operator name the client claims.
type PeerCred struct {
	UID, GID uint32
	PID      int32
}

// AuthType implements credentials.AuthInfo.
func (PeerCred) AuthType() string { return "peercred" }

func (c PeerCred) String() string { return fmt.Sprintf("uid=%d gid=%d pid=%d", c.UID, c.GID, c.PID) }

// PeerCredentials returns server transport credentials for the unix socket
// that exchange nothing on the wire (clients dial with insecure
// credentials) and record the connecting process's SO_PEERCRED.
func PeerCredentials() credentials.TransportCredentials { return peerCreds{} }

type peerCreds struct{}

func (peerCreds) ServerHandshake(c net.Conn) (net.Conn, credentials.AuthInfo, error) {
	under := c
	if w, ok := c.(interface{ NetConn() net.Conn }); ok {
		under = w.NetConn() // a listener's wrapper (internal/netgate's half-open gate)
	}
	uc, ok := under.(*net.UnixConn)
	if !ok {
		return c, nil, nil
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return nil, nil, fmt.Errorf("peercred: %w", err)
	}
	var cred *unix.Ucred
	var serr error
	if err := raw.Control(func(fd uintptr) {
		cred, serr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return nil, nil, fmt.Errorf("peercred: %w", err)
	}
	if serr != nil {
		return nil, nil, fmt.Errorf("peercred: SO_PEERCRED: %w", serr)
	}
	return c, PeerCred{UID: cred.Uid, GID: cred.Gid, PID: cred.Pid}, nil
}

func (peerCreds) ClientHandshake(_ context.Context, _ string, c net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return c, nil, nil
}

func (peerCreds) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "peercred"}
}
func (peerCreds) Clone() credentials.TransportCredentials { return peerCreds{} }
func (peerCreds) OverrideServerName(string) error         { return nil }

// callerCred is the RPC caller's SO_PEERCRED, when the local socket's
// credentials recorded it.
func callerCred(ctx context.Context) (PeerCred, bool) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return PeerCred{}, false
	}
	pc, ok := p.AuthInfo.(PeerCred)
	return pc, ok
}

// callerOf describes the RPC's caller for logs: its SO_PEERCRED when known.
func callerOf(ctx context.Context) string {
	if pc, ok := callerCred(ctx); ok {
		return pc.String()
	}
	return ""
}

// withCaller adds the caller's uid, gid and pid (SO_PEERCRED) to e, when
// known.
func withCaller(ctx context.Context, e *zerolog.Event) *zerolog.Event {
	if pc, ok := callerCred(ctx); ok {
		return e.Uint32("uid", pc.UID).Uint32("gid", pc.GID).Int32("pid", pc.PID)
	}
	return e
}
