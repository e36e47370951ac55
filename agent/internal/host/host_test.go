package host

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/shirou/gopsutil/v4/cpu"
	"github.com/shirou/gopsutil/v4/mem"

	"github.com/trainmeter/trainmeter/pkg/clock"
)

func TestRealRead(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("plausibility bounds are for Linux")
	}
	g := NewGopsutil()
	// burn a little CPU so the window is not empty
	x := 0
	for i := range 5_000_000 {
		x += i
	}
	_ = x
	for range 3 {
		r, err := g.Read()
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%+v", r)
		if r.MemTotalMiB < 64 || r.MemUsedMiB <= 0 || r.MemUsedMiB > r.MemTotalMiB {
			t.Fatalf("implausible memory %+v", r)
		}
		if r.CPUPct < 0 || r.CPUPct > 100 {
			t.Fatalf("implausible cpu %+v", r)
		}
		if r.CPUCount < 1 || r.CPUCount > 100_000 {
			t.Fatalf("implausible cpu count %+v", r)
		}
	}
}

func TestCPUDelta(t *testing.T) {
	seq := []cpu.TimesStat{
		{User: 10, System: 5, Idle: 85},                          // baseline
		{User: 40, System: 5, Idle: 155},                         // +30 busy, +70 idle: 30 %
		{User: 40, System: 5, Idle: 155},                         // no time: 0 %
		{User: 140, System: 5, Idle: 155, Guest: 50},             // all busy (guest is inside user)
		{User: 150, System: 5, Idle: 155, Guest: 50, Iowait: 30}, // iowait counts as idle: 25 %
	}
	k := 0
	g := &Gopsutil{
		times: func(context.Context) (cpu.TimesStat, error) {
			ts := seq[k]
			k++
			return ts, nil
		},
		virtual: func(context.Context) (*mem.VirtualMemoryStat, error) {
			return &mem.VirtualMemoryStat{Total: 64 << 30, Used: 16 << 30}, nil
		},
	}
	g.init()
	want := []float64{30, 0, 100, 25}
	for i, w := range want {
		r, err := g.Read()
		if err != nil {
			t.Fatal(err)
		}
		if r.CPUPct != w {
			t.Errorf("read %d: cpu %v, want %v", i, r.CPUPct, w)
		}
		if r.MemTotalMiB != 65536 || r.MemUsedMiB != 16384 {
			t.Fatalf("mem %+v", r)
		}
	}
}

func TestPartialFailure(t *testing.T) {
	boom := errors.New("boom")
	g := &Gopsutil{
		times: func(context.Context) (cpu.TimesStat, error) { return cpu.TimesStat{}, boom },
		virtual: func(context.Context) (*mem.VirtualMemoryStat, error) {
			return &mem.VirtualMemoryStat{Total: mib, Used: mib / 2}, nil
		},
	}
	g.init()
	r, err := g.Read()
	if !errors.Is(err, boom) || r.MemUsedMiB != 0.5 || r.CPUCount < 1 {
		t.Fatalf("%+v %v", r, err)
	}
	g.times = func(context.Context) (cpu.TimesStat, error) { return cpu.TimesStat{Idle: 1}, nil }
	g.virtual = func(context.Context) (*mem.VirtualMemoryStat, error) { return nil, boom }
	r, err = g.Read()
	if !errors.Is(err, boom) || r.MemTotalMiB != 0 {
		t.Fatalf("%+v %v", r, err)
	}
}

func TestReplayPlaysRowsInTime(t *testing.T) {
	clk := clock.NewFake(time.Unix(1000, 0))
	r, err := ParseReplay(strings.NewReader("# host\ntime_s,memory_used_mib,memory_total_mib,cpu_count\n0,1000,2000,8\n2,1900,2000,8\n"), clk)
	if err != nil {
		t.Fatal(err)
	}
	got, err := r.Read()
	if err != nil || got.MemUsedMiB != 1000 || got.MemTotalMiB != 2000 || got.CPUCount != 8 {
		t.Fatalf("t=0: %+v %v", got, err)
	}
	clk.Advance(2500 * time.Millisecond)
	if got, _ = r.Read(); got.MemUsedMiB != 1900 {
		t.Fatalf("t=2.5: %+v", got)
	}
}

func TestReplayRejectsBadTraces(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"time_s,memory_used_mib\n0,1\n", `lacks column "memory_total_mib"`},
		{"time_s,memory_used_mib,memory_total_mib\n0,-1,10\n", "line 2: memory_used_mib"},
		{"time_s,memory_used_mib,memory_total_mib\n1,1,10\n0,1,10\n", "before the previous"},
		{"time_s,memory_used_mib,memory_total_mib\n0,11,10\n", "exceeds"},
		{"time_s,memory_used_mib,memory_total_mib\n", "no rows"},
	} {
		_, err := ParseReplay(strings.NewReader(tc.in), clock.Real{})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want %q", tc.in, err, tc.want)
		}
	}
}
