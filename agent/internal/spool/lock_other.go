//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package spool

import "os"

// lockDir only creates the lock file where flock is not available.
func lockDir(path string) (*os.File, error) {
	return os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o640)
}

func unlockDir(f *os.File) {
	if f != nil {
		_ = f.Close()
	}
}
