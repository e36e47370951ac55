package console

// SetVersion makes the console show v as its version until the returned
// function restores the binary's.
func SetVersion(v func() string) (restore func()) {
	old := version
	version = v
	return func() { version = old }
}
