package client

// RoundTrips is how many requests c sent on its data connection.
func RoundTrips(c *Client) uint32 {
	c.data.mu.Lock()
	defer c.data.mu.Unlock()
	return c.data.seq
}

// ProtocolVersion is the data socket's protocol version the daemon agreed.
func ProtocolVersion(c *Client) uint32 { return c.data.version }
