//go:build linux

package trainersock

import (
	"io"
	"net"
	"os"
	"syscall"
	"unsafe"
)

// rawReader reads a trainer's socket without entering the Go runtime's
// system call path.
//
// Why: every read(2) made through os/net calls runtime.entersyscall, which
// wakes the runtime's sysmon thread when the process was idle and resets it
// to 20 µs polling, so each trainer step (one line, one read and one read
// that finds nothing) cost the agent ~14 context switches instead of ~2
// (docs/benchmarks.md, appendix, "Third round"). A read of a non-blocking socket never
// blocks, which is the case syscall.RawSyscall is for; RawConn.Read still
// parks the goroutine on the netpoller when there is nothing to read, and
// still honours Close and deadlines.
type rawReader struct {
	rc syscall.RawConn
}

func newSocketReader(nc *net.UnixConn) io.Reader {
	rc, err := nc.SyscallConn()
	if err != nil {
		return nc
	}
	return rawReader{rc}
}

func (r rawReader) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	var (
		n     int
		errno syscall.Errno
	)
	err := r.rc.Read(func(fd uintptr) bool {
		for {
			m, _, e := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
			switch e {
			case syscall.EINTR:
				continue
			case syscall.EAGAIN:
				return false // nothing yet: park on the netpoller
			}
			n, errno = int(m), e
			return true
		}
	})
	switch {
	case err != nil:
		return 0, err
	case errno != 0:
		return 0, &net.OpError{Op: "read", Net: "unix", Err: os.NewSyscallError("read", errno)}
	case n == 0:
		return 0, io.EOF
	}
	return n, nil
}
