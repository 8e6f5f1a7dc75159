package client

// RoundTrips is how many requests c sent on its data connection.
func RoundTrips(c *Client) uint32 {
	d := c.data.current()
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.seq
}

// ProtocolVersion is the data socket's protocol version the daemon agreed.
func ProtocolVersion(c *Client) uint32 { return c.data.current().version }

// Reconnects is how many times c dialled its data socket again.
func Reconnects(c *Client) int {
	c.data.mu.Lock()
	defer c.data.mu.Unlock()
	return c.data.reconnects
}
