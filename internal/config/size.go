package config

import "github.com/pegaflow/pegad/internal/bytesize"

// ByteSize is a number of bytes in the operators' notation (see
// bytesize.Size): config keys and flags of sizes decode into it.
type ByteSize = bytesize.Size

// ParseByteSize parses s (see bytesize.Parse).
func ParseByteSize(s string) (ByteSize, error) { return bytesize.Parse(s) }
