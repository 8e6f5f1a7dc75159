package integration

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/pegaflow/pegad/internal/conn"
)

// TestNICRailsPairDaemons: two daemons whose --nics name rails
// (RAIL=DEVICE), with different device names and the holder's rails in
// another order, pair their NICs by rail: the holder serves the
// requester's rail-0 NIC with its own rail-0 NIC. Without the rails they
// share neither subnet nor name and would pair by position.
func TestNICRailsPairDaemons(t *testing.T) {
	hcfg := baseConfig(t, "holder")
	hcfg.NICs = "r1=hold1,r0=hold0"
	rcfg := baseConfig(t, "requester")
	rcfg.NICs = "r0=req0, r1=req1"
	hold, req := start(t, hcfg), start(t, rcfg)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := req.d.Dialer().Get(ctx, hold.d.PeerAddr()); err != nil {
		t.Fatal(err)
	}
	var paired []string
	for _, ci := range hold.d.Conns().List() {
		if ci.Role != conn.RoleHolder {
			continue
		}
		for _, n := range ci.NICs {
			paired = append(paired, n.Name)
		}
	}
	if want := []string{"hold0", "hold1"}; !slices.Equal(paired, want) {
		t.Fatalf("holder NICs serving the requester's req0, req1: %v, want %v (by rail)", paired, want)
	}
}
