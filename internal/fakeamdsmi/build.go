// Package fakeamdsmi builds a fake libamd_smi.so (lib/fakeamdsmi.c) for tests
// of the agent's optional AMD SMI loading: the real binaries load it from
// LD_LIBRARY_PATH, as they would ROCm's.
package fakeamdsmi

import (
	"path/filepath"

	"github.com/trainmeter/trainmeter/internal/cbuild"
)

// LibName is the file name the agent dlopens.
const LibName = "libamd_smi.so"

// ConfigEnv names the environment variable holding the GPUs file's path:
// one "PCI_ADDRESS RAW_COUNT" line per GPU, counts in 2^-16 J.
const ConfigEnv = "FAKEAMDSMI_CONFIG"

// Build compiles the fake library into dir/libamd_smi.so with $CC (else
// cc) and returns its path.
func Build(dir string) (string, error) {
	src, err := cbuild.CallerDir()
	if err != nil {
		return "", err
	}
	out := filepath.Join(dir, LibName)
	if err := cbuild.SharedLib("fakeamdsmi", out, filepath.Join(src, "lib", "fakeamdsmi.c")); err != nil {
		return "", err
	}
	return out, nil
}
