package gpuopen

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"

	"github.com/trainmeter/trainmeter/agent/internal/gpu/nvmlgpu"
	"github.com/trainmeter/trainmeter/agent/internal/gpu/replay"
	"github.com/trainmeter/trainmeter/agent/internal/gpu/simgpu"
	"github.com/trainmeter/trainmeter/internal/gpu/amdgpu"
)

func TestParseSpec(t *testing.T) {
	good := []struct {
		in   string
		want Spec
	}{
		{"", Spec{Kind: KindAuto}},
		{"auto", Spec{Kind: KindAuto}},
		{" AUTO ", Spec{Kind: KindAuto}},
		{"nvml", Spec{Kind: KindNVML}},
		{"amd", Spec{Kind: KindAMD}},
		{"AMD", Spec{Kind: KindAMD}},
		{"sim", Spec{Kind: KindSim, N: 2, Seed: 1}},
		{"sim:1", Spec{Kind: KindSim, N: 1, Seed: 1}},
		{"sim:64", Spec{Kind: KindSim, N: 64, Seed: 1}},
		{"sim:8:42", Spec{Kind: KindSim, N: 8, Seed: 42}},
		{"sim:2:-7", Spec{Kind: KindSim, N: 2, Seed: -7}},
		{"replay:trace.csv", Spec{Kind: KindReplay, Path: "trace.csv"}},
		{"replay:/a/b:c.csv", Spec{Kind: KindReplay, Path: "/a/b:c.csv"}},
	}
	for _, c := range good {
		got, err := ParseSpec(c.in)
		if err != nil || got != c.want {
			t.Errorf("ParseSpec(%q) = %+v, %v; want %+v", c.in, got, err, c.want)
		}
	}
	bad := []struct{ in, want string }{
		{"sim:0", "from 1 to 64"},
		{"sim:65", "from 1 to 64"},
		{"sim:x", "from 1 to 64"},
		{"sim:", "from 1 to 64"},
		{"sim:2:x", "integer seed"},
		{"replay:", "needs a trace file"},
		{"replay", "needs a trace file"},
		{"nvml:0", "nvml takes no argument"},
		{"auto:1", "auto takes no argument"},
		{"amd:0", "amd takes no argument"},
		{"cuda", `unknown backend "cuda"`},
		{"gpu0", "unknown backend"},
	}
	for _, c := range bad {
		_, err := ParseSpec(c.in)
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "--gpu") {
			t.Errorf("ParseSpec(%q) err = %v, want it to contain %q", c.in, err, c.want)
		}
	}
}

func TestOpenSim(t *testing.T) {
	b, err := OpenWith("sim:3", Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if _, ok := b.(*simgpu.Backend); !ok || len(b.Devices()) != 3 {
		t.Fatalf("%T %d", b, len(b.Devices()))
	}
	if _, err := OpenWith("sim:99", Options{}); err == nil {
		t.Fatal("sim:99: want error")
	}
}

func TestOpenReplay(t *testing.T) {
	b, err := OpenWith("replay:../../../deploy/examples/replay-constant-300w.csv", Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if _, ok := b.(*replay.Backend); !ok || len(b.Devices()) != 2 {
		t.Fatalf("%T %d", b, len(b.Devices()))
	}
	p := filepath.Join(t.TempDir(), "bad.csv")
	if err := os.WriteFile(p, []byte("time_s,gpu\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenWith("replay:"+p, Options{}); err == nil || !strings.Contains(err.Error(), "power_w") {
		t.Fatalf("bad trace: err = %v", err)
	}
	if _, err := OpenWith("replay:"+filepath.Join(t.TempDir(), "missing.csv"), Options{}); err == nil {
		t.Fatal("missing trace: want error")
	}
}

// withNVML replaces the NVML library with s for the test.
func withNVML(t *testing.T, s nvml.Interface) {
	t.Helper()
	old := newNVML
	newNVML = func() nvml.Interface { return s }
	t.Cleanup(func() { newNVML = old })
}

func TestOpenAutoWithoutNVML(t *testing.T) {
	s := dgxa100.New()
	s.InitFunc = func() nvml.Return { return nvml.ERROR_LIBRARY_NOT_FOUND }
	withNVML(t, s)
	noAMD := Options{SysfsRoot: t.TempDir()}
	for _, spec := range []string{"", "auto"} {
		_, err := OpenWith(spec, noAMD)
		if err == nil || !strings.Contains(err.Error(), "--gpu sim:2") || !errors.Is(err, nvmlgpu.ErrNoNVML) {
			t.Fatalf("Open(%q) err = %v", spec, err)
		}
		if strings.Count(err.Error(), "--gpu sim:2") != 1 {
			t.Fatalf("hint repeated: %v", err)
		}
	}
	_, err := OpenWith("nvml", Options{})
	if err == nil || !strings.Contains(err.Error(), "NVML/driver not found") || !strings.Contains(err.Error(), "--gpu sim") {
		t.Fatalf("Open(nvml) err = %v", err)
	}

	// other init failures also point at sim
	s.InitFunc = func() nvml.Return { return nvml.ERROR_NO_PERMISSION }
	if _, err := OpenWith("auto", noAMD); err == nil || !strings.Contains(err.Error(), "--gpu sim:2") {
		t.Fatalf("Open(auto) err = %v", err)
	}
}

func TestOpenAutoWithNVML(t *testing.T) {
	s := dgxa100.New()
	s.DeviceGetCountFunc = func() (int, nvml.Return) { return 1, nvml.SUCCESS }
	d := s.Devices[0].(*dgxa100.Device)
	d.GetEnforcedPowerLimitFunc = func() (uint32, nvml.Return) { return 400_000, nvml.SUCCESS }
	d.GetFieldValuesFunc = func(v []nvml.FieldValue) nvml.Return {
		for k := range v {
			v[k].NvmlReturn = uint32(nvml.SUCCESS)
		}
		return nvml.SUCCESS
	}
	withNVML(t, s)
	b, err := OpenWith("auto", Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if _, ok := b.(*nvmlgpu.Backend); !ok || len(b.Devices()) != 1 {
		t.Fatalf("%T %d", b, len(b.Devices()))
	}
}

func TestReplayAnchoredAtAnInstant(t *testing.T) {
	sp, err := ParseSpec("replay:/tmp/a@b.csv@1700000000.5")
	if err != nil {
		t.Fatal(err)
	}
	if sp.Path != "/tmp/a@b.csv" || !sp.Start.Equal(time.Unix(1700000000, 5e8)) {
		t.Errorf("spec %+v", sp)
	}
	if _, err := ParseSpec("replay:x.csv@soon"); err == nil || !strings.Contains(err.Error(), "Unix seconds") {
		t.Errorf("bad anchor accepted: %v", err)
	}
}

const amdFixtures = "../../../internal/gpu/amdgpu/testdata"

func TestOpenAMD(t *testing.T) {
	b, err := OpenWith("amd", Options{SysfsRoot: filepath.Join(amdFixtures, "mi300x", "sys"), ProcfsRoot: filepath.Join(amdFixtures, "mi300x", "proc")})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if _, ok := b.(*amdgpu.Backend); !ok || len(b.Devices()) != 2 || b.Devices()[0].Vendor != "amd" {
		t.Fatalf("%T %+v", b, b.Devices())
	}
	if _, err := OpenWith("amd", Options{SysfsRoot: t.TempDir()}); err == nil || !errors.Is(err, amdgpu.ErrNoAMD) || !strings.Contains(err.Error(), "--gpu sim:2") {
		t.Fatalf("amd without cards: err = %v", err)
	}
}

// auto picks amd when NVML finds nothing and the node has AMD cards and no
// NVIDIA GPU; with an NVIDIA GPU on the bus it refuses to guess.
func TestOpenAutoPicksAMDOnlyWithoutNVIDIA(t *testing.T) {
	s := dgxa100.New()
	s.InitFunc = func() nvml.Return { return nvml.ERROR_LIBRARY_NOT_FOUND }
	withNVML(t, s)
	b, err := OpenWith("auto", Options{SysfsRoot: filepath.Join(amdFixtures, "rx7900xtx", "sys")})
	if err != nil {
		t.Fatal(err)
	}
	b.Close()
	if _, ok := b.(*amdgpu.Backend); !ok {
		t.Fatalf("auto opened %T, want the amd backend", b)
	}
	_, err = OpenWith("auto", Options{SysfsRoot: filepath.Join(amdFixtures, "nvidia-and-amd", "sys")})
	if err == nil || !strings.Contains(err.Error(), "--gpu amd") || !errors.Is(err, nvmlgpu.ErrNoNVML) {
		t.Fatalf("NVIDIA and AMD, NVML broken: err = %v", err)
	}
}
