package ledger

import (
	"testing"
	"time"

	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// hostRig adds RAPL reads to a rig: package and DRAM counters (µJ, summed
// over two sockets) that the test advances between reads.
type hostRig struct {
	*rig
	cpuUJ, dramUJ uint64
	runCPU        map[string]float64 // cumulative CPU seconds per run; nil: not read
}

func (h *hostRig) read() {
	zones := []HostZone{
		{Socket: 0, Domain: "package", Name: "package-0", EnergyUJ: h.cpuUJ / 2},
		{Socket: 0, Domain: "dram", Name: "dram", EnergyUJ: h.dramUJ / 2},
		{Socket: 1, Domain: "package", Name: "package-1", EnergyUJ: h.cpuUJ - h.cpuUJ/2},
		{Socket: 1, Domain: "dram", Name: "dram", EnergyUJ: h.dramUJ - h.dramUJ/2},
	}
	var cpu map[string]float64
	if h.runCPU != nil {
		cpu = map[string]float64{}
		for k, v := range h.runCPU {
			cpu[k] = v
		}
	}
	h.l.AddHostPoint(HostPoint{T: h.now, Zones: zones, CPUUJ: h.cpuUJ, DRAMUJ: h.dramUJ, DRAMOK: true, RunCPU: cpu})
}

func (h *hostRig) intervals() []*trainmeterv1.HostEnergy {
	var out []*trainmeterv1.HostEnergy
	for _, b := range h.batches {
		out = append(out, b.HostEnergy...)
	}
	return out
}

// hostTotals sums every interval: the node's, idle and each run's.
func (h *hostRig) hostTotals() (cpu, dram, idleCPU, idleDRAM float64, runCPU, runDRAM map[string]float64, splits map[string][]string) {
	runCPU, runDRAM, splits = map[string]float64{}, map[string]float64{}, map[string][]string{}
	for _, e := range h.intervals() {
		cpu += e.CpuEnergyJ
		dram += e.DramEnergyJ
		idleCPU += e.IdleCpuEnergyJ
		idleDRAM += e.IdleDramEnergyJ
		for _, s := range e.Runs {
			runCPU[s.RunId] += s.CpuEnergyJ
			runDRAM[s.RunId] += s.DramEnergyJ
			splits[s.RunId] = appendNew(splits[s.RunId], s.Split)
		}
	}
	return
}

func exact(t *testing.T, what string, got, want float64) {
	t.Helper()
	if got != want {
		t.Errorf("%s = %v, want exactly %v", what, got, want)
	}
}

// A run alone on the node gets exactly the counters' difference over its
// reads; before it started and after it ended the energy is idle.
func TestHostEnergyOfARunAloneIsTheCounterDifference(t *testing.T) {
	h := &hostRig{rig: newRig(t, []float64{300}, []float64{300}, 0), cpuUJ: 5e9, dramUJ: 7e8}
	h.advance(500 * time.Millisecond)
	h.read() // baseline
	h.advance(500 * time.Millisecond)
	h.cpuUJ += 80e6 // 80 J with no run: idle
	h.dramUJ += 10e6
	h.read()
	startOn(t, h.rig, peer1, "a", "0")
	h.advance(200 * time.Millisecond)
	h.read() // the interval of the start used no energy: no part of it is a guess
	for range 3 {
		h.advance(time.Second)
		h.cpuUJ += 150_250_000
		h.dramUJ += 20_500_000
		h.read()
	}
	h.advance(300 * time.Millisecond)
	endRun(t, h.rig, peer1, "a")
	h.advance(time.Second)
	h.read()
	h.cpuUJ += 60e6
	h.advance(time.Second)
	h.read()
	h.advance(2 * time.Second)

	cpu, dram, idleCPU, idleDRAM, runCPU, runDRAM, splits := h.hostTotals()
	exact(t, "run cpu", runCPU["a"], 3*150.25)
	exact(t, "run dram", runDRAM["a"], 3*20.5)
	exact(t, "node cpu", cpu, 80+3*150.25+60)
	exact(t, "idle cpu", idleCPU, 80+60)
	exact(t, "idle dram", idleDRAM, 10)
	exact(t, "node dram", dram, 10+3*20.5)
	if len(splits["a"]) != 1 || splits["a"][0] != HostSplitExclusive {
		t.Errorf("splits %v", splits["a"])
	}
	// per socket and domain
	var zones [4]float64
	for _, e := range h.intervals() {
		for i, z := range e.Zones {
			zones[i] += z.EnergyJ
		}
	}
	if zones[0]+zones[2] != cpu || zones[1]+zones[3] != dram {
		t.Errorf("zones %v do not add up to cpu %v dram %v", zones, cpu, dram)
	}
}

// Two runs overlapping: the time they share the node is split by their
// processes' CPU time over each interval; before the second run's first
// interval with a CPU reading at both ends, equally. Runs + idle = node.
func TestHostEnergySplitByCPUTimeBetweenOverlappingRuns(t *testing.T) {
	h := &hostRig{rig: newRig(t, []float64{300}, []float64{300}, 0), cpuUJ: 1e9, dramUJ: 1e9}
	h.advance(time.Second)
	h.read()
	startOn(t, h.rig, peer1, "a", "0")
	h.advance(time.Second)
	h.cpuUJ += 100e6 // [1s, 2s): a alone from its start (at the read): all a's
	h.dramUJ += 10e6
	h.read()
	h.advance(500 * time.Millisecond)
	startOn(t, h.rig, peer2, "b", "0")
	h.advance(500 * time.Millisecond)
	h.runCPU = map[string]float64{"a": 10, "b": 0}
	h.cpuUJ += 100e6 // [2s, 3s): a alone half, then a and b with no CPU reading yet: equal
	h.dramUJ += 10e6
	h.read()
	h.advance(time.Second)
	h.runCPU = map[string]float64{"a": 13, "b": 1} // a used 3 CPU-s, b 1
	h.cpuUJ += 200e6
	h.dramUJ += 40e6
	h.read()
	endRun(t, h.rig, peer1, "a")
	endRun(t, h.rig, peer2, "b")
	h.advance(3 * time.Second)
	h.read()

	cpu, dram, idleCPU, idleDRAM, runCPU, runDRAM, splits := h.hostTotals()
	near(t, "a cpu", runCPU["a"], 100+50+25+150, 1e-9)
	near(t, "b cpu", runCPU["b"], 25+50, 1e-9)
	near(t, "a dram", runDRAM["a"], 10+5+2.5+30, 1e-9)
	near(t, "b dram", runDRAM["b"], 2.5+10, 1e-9)
	near(t, "runs + idle cpu", runCPU["a"]+runCPU["b"]+idleCPU, cpu, 1e-9)
	near(t, "runs + idle dram", runDRAM["a"]+runDRAM["b"]+idleDRAM, dram, 1e-9)
	exact(t, "node cpu", cpu, 400)
	if got := splits["b"]; len(got) != 2 || got[0] != HostSplitEqual || got[1] != HostSplitCPUTime {
		t.Errorf("b's splits %v, want equal then cpu_time", got)
	}
	var cpuS float64
	for _, e := range h.intervals() {
		for _, s := range e.Runs {
			if s.RunId == "a" && s.CpuS != nil {
				cpuS += *s.CpuS
			}
		}
	}
	exact(t, "a's CPU seconds", cpuS, 3)
}

// A run that starts and ends between two reads, even one whose windows
// are all out before the read, gets its part of the interval.
func TestHostEnergyOfARunShorterThanAnInterval(t *testing.T) {
	h := &hostRig{rig: newRig(t, []float64{300}, []float64{300}, 0), cpuUJ: 1e9}
	h.advance(time.Second)
	h.read()
	startOn(t, h.rig, peer1, "short", "0")
	h.advance(250 * time.Millisecond)
	endRun(t, h.rig, peer1, "short")
	h.advance(3 * time.Second) // its windows closed and it left the ledger
	h.cpuUJ += 3250e6
	h.read()
	h.advance(2 * time.Second)
	_, _, idleCPU, _, runCPU, _, _ := h.hostTotals()
	near(t, "short run's cpu", runCPU["short"], 250, 1e-6)
	near(t, "idle", idleCPU, 3000, 1e-6)
}

// Without reads (no RAPL, or refused) nothing is sent and the ended runs
// kept for the split do not pile up.
func TestHostEnergyWithoutReadsKeepsNothing(t *testing.T) {
	r := newRig(t, []float64{300}, []float64{300}, 0)
	for i := range 50 {
		p := Peer{ConnID: uint64(100 + i), PID: int32(1000 + i), UID: 1000}
		startOn(t, r, p, "run-"+string(rune('a'+i%26))+string(rune('a'+i/26)), "0")
		r.advance(100 * time.Millisecond)
		endRun(t, r, p, "run-"+string(rune('a'+i%26))+string(rune('a'+i/26)))
	}
	r.advance(3 * time.Second)
	for _, b := range r.batches {
		if len(b.HostEnergy) > 0 {
			t.Fatal("host energy without any RAPL read")
		}
	}
	if n := len(r.l.hostEnergy.runs); n > 1 {
		t.Fatalf("%d ended runs kept for a host split that cannot come", n)
	}
}

// After reads failing for longer than MaxHostGap the counters may have
// wrapped unseen: that gap is not booked, the reads after it are.
func TestHostEnergyGapLongerThanAWrapIsNotBooked(t *testing.T) {
	h := &hostRig{rig: newRig(t, []float64{300}, []float64{300}, 0), cpuUJ: 1e9}
	h.advance(time.Second)
	h.read()
	startOn(t, h.rig, peer1, "a", "0")
	h.now = h.now.Add(MaxHostGap + time.Second) // no read meanwhile (refused), no tick either
	h.cpuUJ += 99_000e6
	h.read()
	h.advance(time.Second)
	h.cpuUJ += 40e6
	h.read()
	endRun(t, h.rig, peer1, "a")
	h.advance(3 * time.Second)
	cpu, _, _, _, runCPU, _, _ := h.hostTotals()
	exact(t, "node cpu", cpu, 40)
	exact(t, "run cpu", runCPU["a"], 40)
}
