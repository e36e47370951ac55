package replay

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/trainmeter/trainmeter/pkg/gpu"
)

var t0 = time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)

const header = "time_s,gpu,power_w,energy_j,memory_used_mib,memory_total_mib,utilization_pct\n"

func mustParse(t *testing.T, s string) *Backend {
	t.Helper()
	b, err := Parse(strings.NewReader(s))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func read(t *testing.T, b *Backend, at time.Duration) []gpu.Sample {
	t.Helper()
	dst := make([]gpu.Sample, len(b.Devices()))
	if err := b.Read(t0.Add(at), dst); err != nil {
		t.Fatal(err)
	}
	return dst
}

func TestParseErrors(t *testing.T) {
	cases := []struct {
		name, in, want string
	}{
		{"empty", "", "empty trace"},
		{"missing column", "time_s,gpu,power_w,energy_j,memory_used_mib,memory_total_mib\n", `line 1: header lacks column "utilization_pct"`},
		{"duplicate column", "gpu," + header, `column "gpu" appears twice`},
		{"no rows", header, "no rows"},
		{"nan power", header + "0,0,NaN,1,1,80,1\n", `line 2: power_w = "NaN" is not a finite number`},
		{"inf energy", header + "0,0,1,+Inf,1,80,1\n", `line 2: energy_j = "+Inf" is not a finite number`},
		{"garbage", header + "0,0,abc,1,1,80,1\n", `line 2: power_w = "abc"`},
		{"negative power", header + "0,0,1,1,1,80,\n0.1,0,-5,1,1,80,\n", `line 3: power_w = "-5" is negative`},
		{"negative time", header + "-1,0,1,1,1,80,\n", `line 2: time_s = "-1" is negative`},
		{"empty power", header + "0,0,,1,1,80,1\n", "line 2: power_w is empty"},
		{"empty memory", header + "0,0,1,1,,80,1\n", "line 2: memory_used_mib is empty"},
		{"util over 100", header + "0,0,1,1,1,80,101\n", "line 2: utilization_pct = 101 is over 100"},
		{"bad gpu", header + "0,x,1,1,1,80,1\n", `line 2: gpu = "x" is not a GPU index`},
		{"negative gpu", header + "0,-1,1,1,1,80,1\n", `line 2: gpu = "-1"`},
		{"huge gpu", header + "0,100000,1,1,1,80,1\n", `line 2: gpu = "100000"`},
		{"gap in gpus", header + "0,0,1,1,1,80,1\n0,2,1,1,1,80,1\n", "line 3: unknown gpu 2: gpu 1 has no rows"},
		{"time goes back", header + "0,0,1,1,1,80,1\n0,1,1,1,1,80,1\n1,0,1,1,1,80,1\n0.5,0,1,1,1,80,1\n", "line 5: gpu 0: time_s 0.5 is before the previous row's 1"},
		{"comments count for lines", "# a comment\n" + header + "\n# another\n0,0,NaN,1,1,80,1\n", "line 5:"},
		{"csv quote", header + "0,0,\"1,1,1,80,1\n", "replay:"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse(strings.NewReader(c.in))
			if err == nil {
				t.Fatalf("want error containing %q", c.want)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %q, want it to contain %q", err, c.want)
			}
		})
	}
}

func TestOpenMissing(t *testing.T) {
	_, err := Open(filepath.Join(t.TempDir(), "nope.csv"))
	if err == nil || !strings.Contains(err.Error(), "nope.csv") {
		t.Fatalf("err = %v", err)
	}
	p := filepath.Join(t.TempDir(), "bad.csv")
	if err := os.WriteFile(p, []byte(header+"0,0,NaN,1,1,80,1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(p); err == nil || !strings.Contains(err.Error(), "bad.csv: replay: line 2") {
		t.Fatalf("err = %v", err)
	}
}

func TestColumnsAnyOrder(t *testing.T) {
	b := mustParse(t, "extra, utilization_pct,GPU,memory_total_mib,memory_used_mib,energy_j,power_w,time_s\n"+
		"zz,50,0,81559,1000,5000,250.5,0\n")
	d := b.Devices()
	if len(d) != 1 || d[0].MemTotalMiB != 81559 || d[0].Name != "Replay GPU" || d[0].UUID != "GPU-replay-0" ||
		!d[0].HasEnergyCounter || !d[0].HasInstantPower {
		t.Fatalf("devices %+v", d)
	}
	s := read(t, b, 0)[0]
	if s.PowerW != 250.5 || s.EnergyJ != 5000 || s.MemUsedMiB != 1000 || s.MemTotalMiB != 81559 || s.UtilPct != 50 ||
		!s.PowerOK || !s.EnergyOK || !s.MemOK || !s.UtilOK {
		t.Fatalf("sample %+v", s)
	}
}

const trace = header +
	"0.0,0,100,1000,500,80000,10\n" +
	"0.5,1,200,,600,40000,\n" + // GPU 1 starts late and has no counter
	"0.1,0,110,1010.5,510,80000,11\n" +
	"0.2,0,120,1022,520,80000,12\n" +
	"1.0,1,210,,610,40000,20\n"

func TestPlayback(t *testing.T) {
	b := mustParse(t, trace)
	d := b.Devices()
	if len(d) != 2 || !d[0].HasEnergyCounter || d[1].HasEnergyCounter || d[1].MemTotalMiB != 40000 {
		t.Fatalf("devices %+v", d)
	}
	if b.Duration() != time.Second {
		t.Fatalf("Duration = %v", b.Duration())
	}

	// first read starts playback
	s := read(t, b, 0)
	if s[0].PowerW != 100 || !s[0].PowerAt.Equal(t0) || !s[0].EnergyAt.Equal(t0) || s[0].ReadAt != t0 {
		t.Fatalf("t=0 gpu0 %+v", s[0])
	}
	// GPU 1 has no row yet
	if g := s[1]; g.PowerOK || g.EnergyOK || g.MemOK || g.UtilOK || g.Err != nil || g.Index != 1 {
		t.Fatalf("t=0 gpu1 %+v", g)
	}

	// 50 ms: same row again, same timestamps: stale
	s2 := read(t, b, 50*time.Millisecond)
	if s2[0].PowerW != 100 || !s2[0].PowerAt.Equal(t0) || !s2[0].EnergyAt.Equal(s[0].EnergyAt) {
		t.Fatalf("t=50ms gpu0 %+v", s2[0])
	}
	if !s2[0].ReadAt.Equal(t0.Add(50 * time.Millisecond)) {
		t.Fatalf("ReadAt %v", s2[0].ReadAt)
	}

	// exactly on a row's time: that row
	s = read(t, b, 100*time.Millisecond)
	if s[0].PowerW != 110 || s[0].EnergyJ != 1010.5 || !s[0].PowerAt.Equal(t0.Add(100*time.Millisecond)) {
		t.Fatalf("t=100ms gpu0 %+v", s[0])
	}

	// GPU 1: no counter, no utilisation in its first row
	s = read(t, b, 700*time.Millisecond)
	if s[0].PowerW != 120 || s[0].UtilPct != 12 || s[0].MemUsedMiB != 520 {
		t.Fatalf("t=700ms gpu0 %+v", s[0])
	}
	g := s[1]
	if !g.PowerOK || g.PowerW != 200 || g.EnergyOK || g.EnergyJ != 0 || !g.EnergyAt.IsZero() ||
		g.UtilOK || !g.MemOK || g.MemUsedMiB != 600 || !g.PowerAt.Equal(t0.Add(500*time.Millisecond)) {
		t.Fatalf("t=700ms gpu1 %+v", g)
	}

	// after the end every GPU holds its last row, with the same timestamps
	for _, at := range []time.Duration{time.Second, 5 * time.Second, time.Hour} {
		s = read(t, b, at)
		if s[0].PowerW != 120 || !s[0].PowerAt.Equal(t0.Add(200*time.Millisecond)) || s[0].EnergyJ != 1022 {
			t.Fatalf("t=%v gpu0 %+v", at, s[0])
		}
		if s[1].PowerW != 210 || !s[1].PowerAt.Equal(t0.Add(time.Second)) || !s[1].UtilOK || s[1].UtilPct != 20 {
			t.Fatalf("t=%v gpu1 %+v", at, s[1])
		}
	}

	// a read before t0 sees nothing yet
	s = read(t, b, -time.Second)
	if s[0].PowerOK || s[1].PowerOK {
		t.Fatalf("before t0: %+v", s)
	}

	if err := b.Read(t0, make([]gpu.Sample, 1)); err == nil {
		t.Fatal("short dst: want error")
	}
}

func TestEqualTimesLastWins(t *testing.T) {
	b := mustParse(t, header+"0,0,100,1,1,80,\n0,0,150,2,1,80,\n")
	if s := read(t, b, 0)[0]; s.PowerW != 150 || s.EnergyJ != 2 {
		t.Fatalf("%+v", s)
	}
}

// TestExample checks the committed example trace: 2 GPUs at 300 W for 20 s,
// rows every 100 ms, counter consistent with the power.
func TestExample(t *testing.T) {
	b, err := Open("../../../../deploy/examples/replay-constant-300w.csv")
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Devices()) != 2 || b.Duration() != 20*time.Second {
		t.Fatalf("devices %d duration %v", len(b.Devices()), b.Duration())
	}
	var first, last []gpu.Sample
	var prevAt time.Time
	for k := 0; k <= 420; k++ { // 21 s at 50 ms
		s := read(t, b, time.Duration(k)*50*time.Millisecond)
		if first == nil {
			first = s
		}
		for _, g := range s {
			if !g.PowerOK || !g.EnergyOK || g.PowerW != 300 {
				t.Fatalf("k=%d %+v", k, g)
			}
		}
		if k%2 == 1 && !s[0].EnergyAt.Equal(prevAt) {
			t.Fatalf("k=%d: 50 ms polling of 100 ms rows should repeat the timestamp", k)
		}
		prevAt = s[0].EnergyAt
		last = s
	}
	for g := range 2 {
		dt := last[g].EnergyAt.Sub(first[g].EnergyAt).Seconds()
		de := last[g].EnergyJ - first[g].EnergyJ
		if dt != 20 || math.Abs(de-300*dt) > 1e-6 {
			t.Fatalf("gpu %d: %v J in %v s", g, de, dt)
		}
	}
}

// TestDocExample keeps the example in docs/replay-format.md parseable.
func TestDocExample(t *testing.T) {
	doc, err := os.ReadFile("../../../../docs/replay-format.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(doc), "```csv\n")
	if !ok {
		t.Fatal("no csv block in the doc")
	}
	block, _, _ := strings.Cut(rest, "```")
	b := mustParse(t, block)
	d := b.Devices()
	if len(d) != 2 || !d[0].HasEnergyCounter || d[1].HasEnergyCounter {
		t.Fatalf("devices %+v", d)
	}
}

func TestPerRunColumns(t *testing.T) {
	b := mustParse(t, "time_s,gpu,power_w,energy_j,memory_used_mib,memory_total_mib,utilization_pct,run_sm_pct:Job-A,run_sm_pct:job-b,run_mem_mib:Job-A\n"+
		"0,0,300,0,100,80000,90,60,20,1000\n"+
		"1,0,300,300,100,80000,90,,30,\n")
	dst := make([]gpu.Sample, 1)
	if got := b.RunUsage(0, t0); got != nil {
		t.Fatalf("before playback: %v", got)
	}
	if err := b.Read(t0, dst); err != nil {
		t.Fatal(err)
	}
	got := b.RunUsage(0, t0.Add(500*time.Millisecond))
	want := map[string]gpu.ProcessUse{"Job-A": {SMPct: 60, SMOK: true, MemMiB: 1000, MemOK: true}, "job-b": {SMPct: 20, SMOK: true}}
	if len(got) != 2 || got["Job-A"] != want["Job-A"] || got["job-b"] != want["job-b"] {
		t.Fatalf("at 0.5 s: %+v", got)
	}
	// An empty cell: no process of that run on the GPU then.
	got = b.RunUsage(0, t0.Add(1500*time.Millisecond))
	if _, ok := got["Job-A"]; ok || got["job-b"].SMPct != 30 {
		t.Fatalf("at 1.5 s: %+v", got)
	}
	for _, bad := range []string{
		"time_s,gpu,power_w,energy_j,memory_used_mib,memory_total_mib,utilization_pct,run_sm_pct:a\n0,0,1,,1,1,,101\n",
		"time_s,gpu,power_w,energy_j,memory_used_mib,memory_total_mib,utilization_pct,run_mem_mib:a\n0,0,1,,1,1,,-1\n",
		"time_s,gpu,power_w,energy_j,memory_used_mib,memory_total_mib,utilization_pct,run_sm_pct:\n0,0,1,,1,1,,1\n",
	} {
		// The error names the line and the column (the header, not the
		// row's cell).
		if _, err := Parse(strings.NewReader(bad)); err == nil || !strings.Contains(err.Error(), "line") || !strings.Contains(err.Error(), "run_") {
			t.Errorf("%q: err %v", bad, err)
		}
	}
}

func TestVendorAndNameColumns(t *testing.T) {
	const h = "time_s,gpu,power_w,energy_j,memory_used_mib,memory_total_mib,utilization_pct,vendor,name\n"
	b := mustParse(t, h+
		"0,0,700,100,1,196608,90,AMD,AMD Instinct MI300X\n"+
		"0,1,300,,1,24576,90,,\n"+
		"0.1,0,700,170,1,196608,90,,\n"+
		"0.1,1,300,,1,24576,90,amd,\n")
	d := b.Devices()
	if d[0].Vendor != "amd" || d[0].Name != "AMD Instinct MI300X" || d[1].Vendor != "amd" || d[1].Name != "Replay GPU" {
		t.Errorf("devices = %+v", d)
	}
	if d := mustParse(t, header+"0,0,1,1,1,80,1\n").Devices()[0]; d.Vendor != "" || d.Name != "Replay GPU" {
		t.Errorf("a trace without the columns: %+v", d)
	}
	for in, want := range map[string]string{
		h + "0,0,1,1,1,80,1,intel,\n":                         `line 2: vendor = "intel": want one of nvidia, amd`,
		h + "0,0,1,1,1,80,1,amd,\n0.1,0,1,1,1,80,1,nvidia,\n": `line 3: gpu 0: vendor "nvidia" differs from its earlier "amd"`,
		h + "0,0,1,1,1,80,1,amd,A\n0.1,0,1,1,1,80,1,,B\n":     `line 3: gpu 0: name "B" differs`,
	} {
		if _, err := Parse(strings.NewReader(in)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("err = %v, want %q", err, want)
		}
	}
}
