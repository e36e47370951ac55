//go:build !linux

package trainersock

import (
	"errors"
	"net"
)

// PeerCred is only implemented on Linux; elsewhere the peer is unknown (-1).
func PeerCred(*net.UnixConn) (pid, uid, gid int32, err error) {
	return -1, -1, -1, errors.New("SO_PEERCRED is not supported on this platform")
}
