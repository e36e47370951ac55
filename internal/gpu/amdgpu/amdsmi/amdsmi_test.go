//go:build linux && cgo

package amdsmi_test

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/trainmeter/trainmeter/internal/fakeamdsmi"
	"github.com/trainmeter/trainmeter/internal/gpu/amdgpu"
	"github.com/trainmeter/trainmeter/internal/gpu/amdgpu/amdsmi"
	"github.com/trainmeter/trainmeter/pkg/gpu"
)

// fakeLib builds the fake library and points it at a GPUs file holding
// lines; it returns the library's path and the file's.
func fakeLib(t *testing.T, lines string) (lib, config string) {
	t.Helper()
	dir := t.TempDir()
	lib, err := fakeamdsmi.Build(dir)
	if err != nil {
		t.Skipf("no C compiler to build the fake libamd_smi: %v", err)
	}
	config = filepath.Join(dir, "gpus")
	if err := os.WriteFile(config, []byte(lines), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv(fakeamdsmi.ConfigEnv, config)
	return lib, config
}

func TestPCIAddress(t *testing.T) {
	// domain 0, bus 0x0c, device 0, function 0, partition bits set
	if got := amdsmi.PCIAddress(0x0c<<8 | 1<<28); got != "0000:0c:00.0" {
		t.Errorf("PCIAddress = %s", got)
	}
	if got := amdsmi.PCIAddress(1<<32 | 0xc4<<8 | 3<<3 | 1); got != "0001:c4:03.1" {
		t.Errorf("PCIAddress = %s", got)
	}
}

func TestNotInstalled(t *testing.T) {
	_, err := amdsmi.Open(filepath.Join(t.TempDir(), "libamd_smi.so"))
	if !errors.Is(err, amdsmi.ErrNotInstalled) {
		t.Fatalf("err = %v, want ErrNotInstalled", err)
	}
}

func TestEnergyCountThroughTheLibrary(t *testing.T) {
	path, _ := fakeLib(t, "0000:03:00.0 65536000\n0000:22:00.0 131072\n")
	l, err := amdsmi.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if l.GPUs() != 2 || l.Path() != path {
		t.Fatalf("gpus %d path %s", l.GPUs(), l.Path())
	}
	raw, unit, ok := l.EnergyCount("0000:03:00.0")
	if !ok || raw != 65536000 || unit != 1.0/65536 {
		t.Errorf("EnergyCount = %d × %g J, %v; want 65536000 × 2^-16 J", raw, unit, ok)
	}
	if _, _, ok := l.EnergyCount("0000:99:00.0"); ok {
		t.Error("a GPU the library does not know answered")
	}
}

// A consumer card whose gpu_metrics has no accumulator gets a counter
// where AMD SMI gives one, and the backend follows it.
func TestBackendTakesTheCounterFromAMDSMI(t *testing.T) {
	path, config := fakeLib(t, "0000:03:00.0 65536000\n")
	l, err := amdsmi.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	b, err := amdgpu.New(amdgpu.Options{SysfsRoot: "../testdata/rx7900xtx/sys", ProcfsRoot: t.TempDir(), SMI: l})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if !b.Devices()[0].HasEnergyCounter || b.Sources(0).CounterSource != "amd-smi "+path {
		t.Fatalf("device %+v, sources %+v", b.Devices()[0], b.Sources(0))
	}
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	s := make([]gpu.Sample, 1)
	if err := b.Read(t0, s); err != nil || !s[0].EnergyOK || s[0].EnergyJ != 1000 {
		t.Fatalf("sample %+v, %v; want 1000 J", s[0], err)
	}
	if err := os.WriteFile(config, []byte("0000:03:00.0 81920000\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := b.Read(t0.Add(time.Second), s); err != nil || s[0].EnergyJ != 1250 {
		t.Fatalf("after 1 s: %+v, %v; want 1250 J", s[0], err)
	}
}
