package requester_test

import (
	"errors"
	"testing"

	"github.com/pegaflow/pegad/internal/conn"
)

// e2eConns is a test node's RDMA connections as the daemon wires them: a
// NIC set, with a Dialer (the engine's) and an Acceptor (the holder's)
// over it.
type e2eConns struct {
	nics *conn.NICs
	dial *conn.Dialer
	acc  *conn.Acceptor
}

// openConns opens them, closed at cleanup: the halves first, then the
// NIC set their QPs are made on.
func openConns(t testing.TB, no conn.NICOptions, do conn.DialerOptions, ao conn.AcceptorOptions) *e2eConns {
	t.Helper()
	nics, err := conn.NewNICs(no)
	if err != nil {
		t.Fatal(err)
	}
	c := &e2eConns{nics: nics}
	t.Cleanup(func() {
		if err := c.close(); err != nil {
			t.Errorf("close connections: %v", err)
		}
	})
	if c.dial, err = conn.NewDialer(nics, do); err != nil {
		t.Fatal(err)
	}
	if c.acc, err = conn.NewAcceptor(nics, ao); err != nil {
		t.Fatal(err)
	}
	return c
}

func (c *e2eConns) close() error {
	var errs []error
	if c.dial != nil {
		errs = append(errs, c.dial.Close())
	}
	if c.acc != nil {
		errs = append(errs, c.acc.Close())
	}
	return errors.Join(append(errs, c.nics.Close())...)
}
