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

// termSize is not known where terminals are not asked: the live status is
// then printed as plain lines.
func termSize(*os.File) (rows, cols int, ok bool) { return 0, 0, false }
