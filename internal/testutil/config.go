package testutil

import (
	"time"

	"github.com/pegaflow/pegad/internal/config"
)

// LoopbackConfig is a single node on loopback for in-process daemons: tcp
// transport, ephemeral peer, data and metrics ports, the local API on
// socket, a 32 MiB pool and a fast lock sweeper. Callers override what
// their test is about.
func LoopbackConfig(nodeID, socket string) config.Config {
	c := config.Default()
	c.NodeID = nodeID
	c.Listen = "127.0.0.1:0"
	c.MetricsListen = "127.0.0.1:0"
	c.Socket = socket
	c.PoolSize = 32 << 20
	c.Transport = config.TransportTCP
	c.TCPDataListen = "127.0.0.1:0"
	c.GCInterval = 50 * time.Millisecond
	c.ShutdownTimeout = 5 * time.Second
	return c
}
