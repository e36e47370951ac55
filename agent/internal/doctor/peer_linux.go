//go:build linux

package doctor

import (
	"fmt"
	"net"
	"syscall"
)

// peerInfo names the process on the other end of a Unix socket (SO_PEERCRED:
// the agent that listens), as " (pid N, user U)", or "" when unknown.
func peerInfo(c net.Conn) string {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return ""
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return ""
	}
	var cred *syscall.Ucred
	var serr error
	if err := raw.Control(func(fd uintptr) {
		cred, serr = syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	}); err != nil || serr != nil || cred == nil {
		return ""
	}
	return fmt.Sprintf(" (pid %d, user %s)", cred.Pid, userName(int(cred.Uid)))
}
