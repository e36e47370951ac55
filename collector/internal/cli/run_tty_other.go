//go:build !linux

package cli

import "os"

// foregroundTTY is false where the terminal's process group is not
// checked: SIGINT is then always passed on.
func foregroundTTY() bool { return false }

// isTTY is whether f is a character device where terminals are not asked.
func isTTY(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
