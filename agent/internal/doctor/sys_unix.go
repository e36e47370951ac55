//go:build unix

package doctor

import (
	"errors"
	"io/fs"
	"os"
	"syscall"
)

// ownerOf returns the file's uid and gid (-1 when unknown).
func ownerOf(fi fs.FileInfo) (uid, gid int) {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return int(st.Uid), int(st.Gid)
	}
	return -1, -1
}

// writable reports whether this process may create files in dir (access(2)
// with W_OK|X_OK: the real uid, which is what a person running doctor is).
func writable(dir string) bool {
	return syscall.Access(dir, 0x2|0x1) == nil
}

// lockHeld reports whether another process holds the flock on path, without
// creating the file or taking the lock for longer than the probe.
func lockHeld(path string) (bool, error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer f.Close()
	err = syscall.Flock(int(f.Fd()), syscall.LOCK_SH|syscall.LOCK_NB)
	if errors.Is(err, syscall.EWOULDBLOCK) {
		return true, nil
	}
	if err != nil {
		return false, err
	}
	_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
	return false, nil
}
