package cli

import (
	"os"
	"syscall"
	"unsafe"
)

// foregroundTTY reports whether this process is in the foreground process
// group of its controlling terminal (stdin): then a Ctrl-C reached the
// command too, which shares our process group.
func foregroundTTY() bool {
	f, err := os.Open("/dev/tty")
	if err != nil {
		return false
	}
	defer f.Close()
	var pgrp int32
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, f.Fd(), uintptr(syscall.TIOCGPGRP), uintptr(unsafe.Pointer(&pgrp))); e != 0 {
		return false
	}
	return int(pgrp) == syscall.Getpgrp()
}

// isTTY reports whether f is a terminal: TCGETS succeeds on terminals
// only (/dev/null is a character device too).
func isTTY(f *os.File) bool {
	var t syscall.Termios
	_, _, e := syscall.Syscall(syscall.SYS_IOCTL, f.Fd(), uintptr(syscall.TCGETS), uintptr(unsafe.Pointer(&t)))
	return e == 0
}

// termSize is the terminal's rows and columns (TIOCGWINSZ).
func termSize(f *os.File) (rows, cols int, ok bool) {
	var ws struct{ Row, Col, X, Y uint16 }
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, f.Fd(), uintptr(syscall.TIOCGWINSZ), uintptr(unsafe.Pointer(&ws))); e != 0 {
		return 0, 0, false
	}
	return int(ws.Row), int(ws.Col), ws.Row > 0 && ws.Col > 0
}
