// Package fakeamdsmi builds a fake libamd_smi.so (lib/fakeamdsmi.c) for tests
// of the agent's optional AMD SMI loading: the real binaries load it from
// LD_LIBRARY_PATH, as they would ROCm's.
package fakeamdsmi

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
)

// LibName is the file name the agent dlopens.
const LibName = "libamd_smi.so"

// ConfigEnv names the environment variable holding the GPUs file's path:
// one "PCI_ADDRESS RAW_COUNT" line per GPU, counts in 2^-16 J.
const ConfigEnv = "FAKEAMDSMI_CONFIG"

// Build compiles the fake library into dir/libamd_smi.so with $CC (else
// cc) and returns its path.
func Build(dir string) (string, error) {
	_, self, _, ok := runtime.Caller(0)
	if !ok {
		return "", errors.New("fakeamdsmi: cannot find its own source")
	}
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "cc"
	}
	out := filepath.Join(dir, LibName)
	cmd := exec.Command(cc, "-shared", "-fPIC", "-O2", "-Wall", "-o", out, filepath.Join(filepath.Dir(self), "lib", "fakeamdsmi.c"))
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("fakeamdsmi: %s: %w\n%s", strings.Join(cmd.Args, " "), err, b)
	}
	return out, nil
}
