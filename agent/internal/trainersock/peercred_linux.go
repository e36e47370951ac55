//go:build linux

package trainersock

import (
	"net"
	"syscall"
)

// PeerCred reads SO_PEERCRED: the pid, uid and gid of the process that
// connected (as of connect(2)).
func PeerCred(c *net.UnixConn) (pid, uid, gid int32, err error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return -1, -1, -1, err
	}
	var cred *syscall.Ucred
	var serr error
	if err := raw.Control(func(fd uintptr) {
		cred, serr = syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	}); err != nil {
		return -1, -1, -1, err
	}
	if serr != nil {
		return -1, -1, -1, serr
	}
	return cred.Pid, int32(cred.Uid), int32(cred.Gid), nil
}
