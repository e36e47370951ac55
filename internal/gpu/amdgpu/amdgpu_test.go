package amdgpu_test

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/trainmeter/trainmeter/internal/gpu/amdgpu"
	"github.com/trainmeter/trainmeter/internal/gpu/amdgpu/amdfixture"
	"github.com/trainmeter/trainmeter/pkg/gpu"

	"github.com/trainmeter/trainmeter/pkg/clock"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// fixture copies testdata/name to a temp dir, so a test may rewrite it.
func fixture(t *testing.T, name string) (sys, proc string) {
	t.Helper()
	dir := t.TempDir()
	if err := os.CopyFS(dir, os.DirFS(filepath.Join("testdata", name))); err != nil {
		t.Fatal(err)
	}
	return filepath.Join(dir, "sys"), filepath.Join(dir, "proc")
}

func open(t *testing.T, sys, proc string, clk clock.Clock) *amdgpu.Backend {
	t.Helper()
	b, err := amdgpu.New(amdgpu.Options{SysfsRoot: sys, ProcfsRoot: proc, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

func read(t *testing.T, b *amdgpu.Backend, at time.Time) []gpu.Sample {
	t.Helper()
	s := make([]gpu.Sample, len(b.Devices()))
	if err := b.Read(at, s); err != nil {
		t.Fatal(err)
	}
	return s
}

// The offsets of the fields read, written by hand from the kernel's
// structs (not through EncodeMetrics), so that the encoder and the parser
// cannot agree on a wrong layout.
func TestParseMetricsAtTheKernelsOffsets(t *testing.T) {
	cases := []struct {
		name                 string
		size                 int
		format, content      uint8
		energyAt, energyBits int
		powerAt, powerBits   int
		power                uint32
		wantW                float64
		gfxAt                int
	}{
		{"v1.0", 80, 1, 0, 36, 32, 34, 16, 290, 290, 28},
		{"v1.3", 120, 1, 3, 24, 64, 22, 16, 250, 250, 16},
		{"v1.4", 288, 1, 4, 24, 64, 10, 16, 700, 700, 12},
		{"v1.5", 360, 1, 5, 88, 64, 10, 16, 750, 750, 12},
		{"v3.0", 120, 3, 0, -1, 0, 112, 32, 25000, 25, 42},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b := make([]byte, c.size)
			for i := range b {
				b[i] = 0xFF
			}
			binary.LittleEndian.PutUint16(b, uint16(c.size))
			b[2], b[3] = c.format, c.content
			switch c.energyBits {
			case 32:
				binary.LittleEndian.PutUint32(b[c.energyAt:], 123456)
			case 64:
				binary.LittleEndian.PutUint64(b[c.energyAt:], 123456)
			}
			if c.powerBits == 16 {
				binary.LittleEndian.PutUint16(b[c.powerAt:], uint16(c.power))
			} else {
				binary.LittleEndian.PutUint32(b[c.powerAt:], c.power)
			}
			binary.LittleEndian.PutUint16(b[c.gfxAt:], 42)
			m, err := amdgpu.ParseMetrics(b)
			if err != nil {
				t.Fatal(err)
			}
			if c.energyBits > 0 && (!m.EnergyOK || m.EnergyRaw != 123456 || m.EnergyBits != c.energyBits) {
				t.Errorf("energy = %d ok=%v bits=%d, want 123456 in %d bits", m.EnergyRaw, m.EnergyOK, m.EnergyBits, c.energyBits)
			}
			if c.energyBits == 0 && m.EnergyOK {
				t.Errorf("v3.0 has no energy accumulator, got %d", m.EnergyRaw)
			}
			if !m.PowerOK || m.PowerW != c.wantW {
				t.Errorf("power = %v W ok=%v, want %v W", m.PowerW, m.PowerOK, c.wantW)
			}
			if !m.GfxBusyOK || m.GfxBusyPct != 42 {
				t.Errorf("gfx busy = %v ok=%v, want 42", m.GfxBusyPct, m.GfxBusyOK)
			}
			enc, err := amdgpu.EncodeMetrics(amdgpu.MetricsSpec{Format: c.format, Content: c.content, EnergyRaw: 123456, PowerW: c.wantW, GfxBusyPct: 42})
			if err != nil {
				t.Fatal(err)
			}
			if len(enc) != c.size {
				t.Errorf("encoded %d bytes, want sizeof = %d", len(enc), c.size)
			}
		})
	}
}

func TestParseMetricsRefusesWhatItCannotRead(t *testing.T) {
	for name, b := range map[string][]byte{
		"empty":      nil,
		"header":     {4, 0, 1, 3},
		"v2.2 (APU)": {120, 0, 2, 2, 0, 0, 0, 0},
		"v9.9":       {8, 0, 9, 9, 0, 0, 0, 0},
	} {
		if _, err := amdgpu.ParseMetrics(b); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

func TestMI300XBoardsReadEveryField(t *testing.T) {
	sys, proc := fixture(t, "mi300x")
	b := open(t, sys, proc, nil)
	devs := b.Devices()
	if len(devs) != 2 {
		t.Fatalf("%d devices, want 2", len(devs))
	}
	d := devs[0]
	want := gpu.Device{Index: 0, UUID: "AMD-a3f1c0d2e4b59687", Name: "AMD Instinct MI300X OAM", Vendor: "amd",
		MemTotalMiB: 192 << 10, PowerLimitW: 750, HasEnergyCounter: true, HasInstantPower: true}
	if d != want {
		t.Errorf("device 0 = %+v\nwant %+v", d, want)
	}
	s := read(t, b, t0)
	if s[0].Err != nil || !s[0].PowerOK || s[0].PowerW != 350 || !s[0].EnergyOK || s[0].EnergyJ != amdfixture.MI300XStartJ ||
		!s[0].MemOK || s[0].MemUsedMiB != 280 || s[0].MemTotalMiB != 192<<10 || !s[0].UtilOK || s[0].UtilPct != 0 {
		t.Errorf("gpu 0 sample = %+v", s[0])
	}
	if s[1].PowerW != 340 {
		t.Errorf("gpu 1 power = %v, want 340", s[1].PowerW)
	}
	src := b.Sources(0)
	if src.Power != "hwmon power1_input" || src.Metrics != "1.5" || !src.Counter || src.PCI != "0000:0c:00.0" {
		t.Errorf("sources = %+v", src)
	}
}

func TestConsumerCardWithoutAccumulatorIntegratesPower(t *testing.T) {
	sys, proc := fixture(t, "rx7900xtx")
	b := open(t, sys, proc, nil)
	d := b.Devices()[0]
	if d.HasEnergyCounter || d.HasInstantPower || d.Name != "AMD Radeon RX 7900 XTX/XT" || d.UUID != "AMD-PCI-0000:03:00.0" || d.PowerLimitW != 327 {
		t.Errorf("device = %+v", d)
	}
	s := read(t, b, t0)[0]
	if !s.PowerOK || s.PowerW != 250 || s.EnergyOK || s.UtilPct != 97 {
		t.Errorf("sample = %+v", s)
	}
	if src := b.Sources(0); src.Power != "hwmon power1_average" || src.Metrics != "1.3" || src.Counter || src.Check.State != amdgpu.CheckNoCounter {
		t.Errorf("sources = %+v", src)
	}
}

func TestAPUWithoutHwmonTakesPowerFromGPUMetricsV3(t *testing.T) {
	sys, proc := fixture(t, "apu-v3")
	b := open(t, sys, proc, nil)
	if d := b.Devices()[0]; d.HasEnergyCounter || d.MemTotalMiB != 512 {
		t.Errorf("device = %+v", d)
	}
	s := read(t, b, t0)[0]
	if !s.PowerOK || s.PowerW != 25 || s.EnergyOK || s.UtilPct != 40 {
		t.Errorf("sample = %+v", s)
	}
	if src := b.Sources(0); src.Power != "gpu_metrics" || src.Metrics != "3.0" || src.Card != "card1" {
		t.Errorf("sources = %+v", src)
	}
}

func TestCardWithMissingFilesOpensAndSaysWhy(t *testing.T) {
	sys, proc := fixture(t, "missing")
	b := open(t, sys, proc, nil)
	if d := b.Devices()[0]; d.HasEnergyCounter || d.Name != "AMD Radeon RX 6900/6800 XT" {
		t.Errorf("device = %+v", d)
	}
	s := make([]gpu.Sample, 1)
	if err := b.Read(t0, s); err != nil {
		t.Fatalf("a card with nothing to read is not a read error: %v", err)
	}
	if s[0].PowerOK || s[0].EnergyOK || s[0].MemOK || s[0].UtilOK {
		t.Errorf("sample = %+v, want nothing", s[0])
	}
	src := b.Sources(0)
	if src.Power != "" || src.PowerError == "" || src.MetricsError == "" {
		t.Errorf("sources = %+v, want the missing files named", src)
	}
}

func TestNoAMDCardIsAnErrorNamingTheTree(t *testing.T) {
	_, err := amdgpu.New(amdgpu.Options{SysfsRoot: t.TempDir()})
	if err == nil {
		t.Fatal("no error")
	}
	if want := "--gpu sim:2"; !contains(err.Error(), want) {
		t.Errorf("error %q does not say %q", err, want)
	}
}

func TestHasNVIDIA(t *testing.T) {
	if !amdgpu.HasNVIDIA(filepath.Join("testdata", "nvidia-and-amd", "sys")) {
		t.Error("the NVIDIA 3D controller was not found")
	}
	if amdgpu.HasNVIDIA(filepath.Join("testdata", "rx7900xtx", "sys")) {
		t.Error("an AMD-only node was said to have an NVIDIA GPU")
	}
}

func TestCounterWrapsAt32Bits(t *testing.T) {
	sys, proc := fixture(t, "wrap-v1.0")
	b := open(t, sys, proc, nil)
	first := read(t, b, t0)[0]
	if !first.EnergyOK || first.EnergyJ != float64(amdfixture.WrapStartRaw)/65536 {
		t.Fatalf("first = %+v", first)
	}
	// 6 J later (2 J past the wrap), one second on: 6 W, plausible.
	set := func(raw uint64) {
		if err := amdfixture.SetMetrics(sys, "card0", amdgpu.MetricsSpec{Format: 1, Content: 0, EnergyRaw: raw, PowerW: 300}); err != nil {
			t.Fatal(err)
		}
	}
	set(2 << 16)
	second := read(t, b, t0.Add(time.Second))[0]
	if !second.EnergyOK || second.EnergyJ-first.EnergyJ != 6 {
		t.Fatalf("across the wrap: %v J -> %v J, want +6 J", first.EnergyJ, second.EnergyJ)
	}
	set(10 << 16)
	third := read(t, b, t0.Add(2*time.Second))[0]
	if third.EnergyJ-second.EnergyJ != 8 {
		t.Errorf("after the wrap: +%v J, want +8 J", third.EnergyJ-second.EnergyJ)
	}
}

func TestCounterResetIsNotTakenForAWrap(t *testing.T) {
	sys, proc := fixture(t, "wrap-v1.0")
	b := open(t, sys, proc, nil)
	set := func(raw uint64) {
		if err := amdfixture.SetMetrics(sys, "card0", amdgpu.MetricsSpec{Format: 1, Content: 0, EnergyRaw: raw, PowerW: 300}); err != nil {
			t.Fatal(err)
		}
	}
	set(1 << 30) // 16384 J
	a := read(t, b, t0)[0]
	set(5 << 16) // back to 5 J in 50 ms: 49 kJ would be a 1 MW wrap
	r := read(t, b, t0.Add(50*time.Millisecond))[0]
	if !r.EnergyOK || r.EnergyJ != 5 {
		t.Errorf("after a reset: %v J -> %v J, want the raw 5 J (a decrease the energy curve bridges)", a.EnergyJ, r.EnergyJ)
	}
}

// A counter that moves a hundredth of what power says is dropped after
// the check span; one that agrees is kept.
func TestCounterCheckedAgainstPower(t *testing.T) {
	for _, c := range []struct {
		name      string
		perTickJ  uint64 // ×2^-16 J per 50 ms tick; power is 300 W = 15 J per tick
		wantState amdgpu.CheckState
		wantOK    bool
	}{
		{"disagrees", 15 << 16 / 100, amdgpu.CheckDisagreed, false},
		{"agrees", 15 << 16, amdgpu.CheckAgreed, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			sys, proc := fixture(t, "counter-disagrees")
			b := open(t, sys, proc, nil)
			raw := uint64(1000 << 16)
			var last gpu.Sample
			for k := 0; k <= 80; k++ { // 4 s of 50 ms ticks
				if err := amdfixture.SetMetrics(sys, "card0", amdgpu.MetricsSpec{Format: 1, Content: 3, EnergyRaw: raw, PowerW: 300}); err != nil {
					t.Fatal(err)
				}
				last = read(t, b, t0.Add(time.Duration(k)*50*time.Millisecond))[0]
				if k < 60 && !last.EnergyOK {
					t.Fatalf("tick %d: counter dropped before the 3 s check span ended", k)
				}
				raw += c.perTickJ
			}
			chk := b.Sources(0).Check
			if chk.State != c.wantState || last.EnergyOK != c.wantOK {
				t.Fatalf("check = %+v, energy ok %v; want %s, %v", chk, last.EnergyOK, c.wantState, c.wantOK)
			}
			if chk.IntegratedJ != 900 || chk.Span != 3*time.Second {
				t.Errorf("check integrated %v J over %v, want 900 J over 3 s", chk.IntegratedJ, chk.Span)
			}
			if !last.PowerOK || last.PowerW != 300 {
				t.Errorf("power = %+v", last)
			}
		})
	}
}

func TestProcessUsageFromFdinfo(t *testing.T) {
	sys, proc := fixture(t, "mi300x")
	clk := clock.NewFake(t0)
	b := open(t, sys, proc, clk)
	pids, err := b.ComputePIDs(0)
	if err != nil || len(pids) != 1 || pids[0] != 4242 {
		t.Fatalf("card0 pids = %v, %v; want [4242] (4243 shares its client)", pids, err)
	}
	if pids, _ := b.ComputePIDs(1); len(pids) != 1 || pids[0] != 5000 {
		t.Fatalf("card1 pids = %v, want [5000]", pids)
	}
	u, err := b.ProcessUsage(0, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if p := u[4242]; !p.MemOK || p.MemMiB != 1024 || p.SMOK {
		t.Errorf("first poll: %+v, want 1024 MiB and no rate yet", p)
	}
	clk.Advance(time.Second)
	if err := amdfixture.WriteClient(proc, amdfixture.Client{PID: 4242, FD: 5, PCI: "0000:0c:00.0", ClientID: 7, EngineNs: 5_500_000_000, VRAMKiB: 2 << 20}); err != nil {
		t.Fatal(err)
	}
	if err := amdfixture.WriteClient(proc, amdfixture.Client{PID: 4243, FD: 5, PCI: "0000:0c:00.0", ClientID: 7, EngineNs: 5_500_000_000, VRAMKiB: 2 << 20}); err != nil {
		t.Fatal(err)
	}
	u, _ = b.ProcessUsage(0, time.Time{})
	if p := u[4242]; !p.SMOK || p.SMPct != 50 || p.MemMiB != 2048 {
		t.Errorf("second poll: %+v, want 50 %% busy (0.5 s of engine in 1 s) and 2048 MiB", p)
	}
	if _, ok := u[4243]; ok || len(u) != 1 {
		t.Errorf("usage = %+v, want only pid 4242", u)
	}
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }

// On a real /proc the scan reads only the fdinfo of fds linked into
// /dev/dri.
func TestProcessScanFollowsFdLinksIntoDevDri(t *testing.T) {
	sys, _ := fixture(t, "mi300x")
	proc := t.TempDir()
	for fd, target := range map[int]string{5: "/dev/dri/renderD128", 6: "/var/log/train.log"} {
		if err := amdfixture.WriteClient(proc, amdfixture.Client{PID: 77, FD: fd, PCI: "0000:0c:00.0", ClientID: fd, VRAMKiB: 1 << 10}); err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Join(proc, "77", "fd"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(target, filepath.Join(proc, "77", "fd", strconv.Itoa(fd))); err != nil {
			t.Fatal(err)
		}
	}
	b := open(t, sys, proc, nil)
	u, err := b.ProcessUsage(0, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if p := u[77]; p.MemMiB != 1 {
		t.Errorf("pid 77: %+v, want 1 MiB from fd 5 alone (fd 6 is not a DRM device)", p)
	}
}

// A card in runtime suspend at the agent's start answers EPERM; its
// gpu_metrics (and so its counter) is taken up at the first read that
// works, not lost for the agent's life. (A directory stands in for the
// unreadable file: root reads any mode.)
func TestGPUMetricsUnreadableAtStartIsTakenUpLater(t *testing.T) {
	sys, proc := fixture(t, "mi300x")
	metrics := filepath.Join(sys, "class/drm/card0/device/gpu_metrics")
	good, err := os.ReadFile(metrics)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(metrics); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(metrics, 0o755); err != nil {
		t.Fatal(err)
	}
	b := open(t, sys, proc, nil)
	if s := read(t, b, t0)[0]; s.EnergyOK || !s.PowerOK {
		t.Fatalf("while unreadable: %+v", s)
	}
	if err := os.Remove(metrics); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(metrics, good, 0o644); err != nil {
		t.Fatal(err)
	}
	s := read(t, b, t0.Add(time.Second))[0]
	if !s.EnergyOK || s.EnergyJ != amdfixture.MI300XStartJ {
		t.Errorf("once readable: %+v, want the counter", s)
	}
	if src := b.Sources(0); src.Metrics != "1.5" || src.CounterSource != "gpu_metrics" || src.Check.State != amdgpu.CheckPending {
		t.Errorf("sources = %+v", src)
	}
}
