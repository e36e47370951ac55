//go:build !linux

package cli

// foregroundTTY is false where the terminal's process group is not
// checked: SIGINT is then always passed on.
func foregroundTTY() bool { return false }
