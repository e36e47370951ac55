//go:build !linux

package trainersock

import (
	"io"
	"net"
)

// newSocketReader: the raw read path (rawread_linux.go) is Linux-only.
func newSocketReader(nc *net.UnixConn) io.Reader { return nc }
