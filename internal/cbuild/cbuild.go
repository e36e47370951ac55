// Package cbuild compiles the fake C libraries the tests load in place of
// a vendor's (libnvidia-ml, libamd_smi), with the same compiler cgo uses,
// so a test binary and the library it dlopens agree on the toolchain.
package cbuild

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
)

// CallerDir is the directory of the Go source file that calls it: where a
// fake library's C sources sit beside its Go package, whatever the
// current directory of the test that builds it.
func CallerDir() (string, error) {
	_, file, _, ok := runtime.Caller(1)
	if !ok {
		return "", errors.New("cbuild: cannot find the caller's source")
	}
	return filepath.Dir(file), nil
}

// SharedLib compiles a shared library into out with $CC (else cc), -O2
// and -Wall; args are the extra flags and the sources, in the compiler's
// order. what names the library in the error, which holds the command and
// the compiler's output.
func SharedLib(what, out string, args ...string) error {
	cmd := exec.Command(cmp.Or(os.Getenv("CC"), "cc"), append([]string{"-shared", "-fPIC", "-O2", "-Wall", "-o", out}, args...)...)
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s: %s: %w\n%s", what, strings.Join(cmd.Args, " "), err, b)
	}
	return nil
}
