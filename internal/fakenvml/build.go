package fakenvml

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/trainmeter/trainmeter/internal/cbuild"
)

// LibName is the file name go-nvml dlopens.
const LibName = "libnvidia-ml.so.1"

// ConfigEnv names the environment variable holding the config file's path.
const ConfigEnv = "FAKENVML_CONFIG"

// Build compiles the fake library into dir/libnvidia-ml.so.1 with the C
// compiler cgo uses ($CC, else cc) and returns dir, the directory to put on
// LD_LIBRARY_PATH. It compiles against the nvml.h of the go-nvml version in
// go.mod, so the signatures and structs are the ones the agent is built with.
func Build(dir string) (string, error) {
	src, err := cbuild.CallerDir()
	if err != nil {
		return "", err
	}
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/NVIDIA/go-nvml").Output()
	if err != nil {
		return "", fmt.Errorf("fakenvml: locating go-nvml's nvml.h: %w", err)
	}
	header := filepath.Join(strings.TrimSpace(string(out)), "pkg", "nvml")
	// Export only the NVML entry points: the sensor model's symbols must not
	// clash with the copy compiled into a test binary through cgo.
	exports := filepath.Join(dir, "fakenvml.map")
	if err := os.WriteFile(exports, []byte("{ global: nvml*; local: *; };\n"), 0o644); err != nil {
		return "", err
	}
	if err := cbuild.SharedLib("fakenvml", filepath.Join(dir, LibName), "-Wl,--version-script="+exports,
		"-DNVML_NO_UNVERSIONED_FUNC_DEFS=1", "-I", header,
		filepath.Join(src, "lib", "fakenvml.c"), filepath.Join(src, "sensor.c"), "-lm"); err != nil {
		return "", err
	}
	return dir, nil
}
