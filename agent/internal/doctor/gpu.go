package doctor

import (
	"cmp"
	"fmt"
	"strings"
	"time"

	"github.com/trainmeter/trainmeter/agent/internal/gpu/nvmlgpu"
	"github.com/trainmeter/trainmeter/agent/internal/gpuopen"
	"github.com/trainmeter/trainmeter/internal/plural"
	"github.com/trainmeter/trainmeter/pkg/gpu"
)

const noGPUHint = "to try trainmeter without a GPU, run the agent with --gpu sim:2 (simulated GPUs) or --gpu replay:FILE (a recorded trace)"

func checkGPU(o Options, r *Report) {
	sp, err := gpuopen.ParseSpec(o.Config.GPU)
	if err != nil {
		r.add(SectionGPU, "backend", Fail, err.Error(), "")
		return
	}
	switch sp.Kind {
	case gpuopen.KindAMD:
		checkAMD(o, false, r)
	case gpuopen.KindAuto:
		if autoPicksAMD(o) {
			checkAMD(o, true, r)
			return
		}
		checkNVML(o, sp, r)
	case gpuopen.KindNVML:
		checkNVML(o, sp, r)
	default:
		checkSimulated(o, sp, r)
	}
}

func checkNVML(o Options, sp gpuopen.Spec, r *Report) {
	rep, err := nvmlgpu.Diagnose(o.NVML(), nvmlgpu.DiagnoseOptions{Gap: o.Gap})
	prefix := ""
	if sp.Kind == gpuopen.KindAuto {
		prefix = "--gpu auto found no usable NVIDIA GPU: "
	}
	if rep.InitError != "" {
		r.add(SectionGPU, "nvml", Fail, prefix+rep.InitError, noGPUHint)
		return
	}
	if err != nil {
		r.add(SectionGPU, "nvml", Fail, prefix+err.Error(), "nvidia-smi should show the same problem; "+noGPUHint)
		return
	}
	parts := []string{"NVML loaded"}
	for _, v := range [][2]string{{"driver ", rep.DriverVersion}, {"NVML ", rep.NVMLVersion}, {"CUDA driver ", rep.CUDAVersionString()}} {
		if v[1] != "" {
			parts = append(parts, v[0]+v[1])
		}
	}
	parts = append(parts, plural.N(len(rep.GPUs), "GPU"))
	if len(rep.GPUs) == 0 {
		r.add(SectionGPU, "nvml", Fail, prefix+strings.Join(parts, ", "),
			"nvidia-smi -L should list the GPUs; in a container, pass them in (--gpus all, or the NVIDIA device plugin). "+noGPUHint)
		return
	}
	r.add(SectionGPU, "nvml", OK, strings.Join(parts, ", "), "")
	for _, g := range rep.GPUs {
		gpuChecks(g, r)
	}
}

func gpuChecks(g nvmlgpu.GPUReport, r *Report) {
	name := fmt.Sprintf("gpu %d", g.Index)
	if g.Error != "" {
		r.add(SectionGPU, name, Fail, "cannot be read: "+g.Error,
			fmt.Sprintf("nvidia-smi -q -i %d shows its state; a GPU that has fallen off the bus needs a reset or a reboot", g.Index))
		return
	}
	desc := []string{g.Name, g.UUID}
	if g.MemTotalMiB > 0 {
		desc = append(desc, fmt.Sprintf("%d MiB", g.MemTotalMiB))
	}
	if g.PowerLimitW > 0 {
		desc = append(desc, fmt.Sprintf("power limit %.0f W", g.PowerLimitW))
	}
	if g.Persistence != "" {
		desc = append(desc, "persistence mode "+g.Persistence)
	}
	r.add(SectionGPU, name, OK, strings.Join(desc, ", "), "")

	gap := g.Gap.Round(time.Millisecond)
	ip, ap, en := g.InstantPower, g.AveragePower, g.Energy
	avg := "average power (field 185) not supported"
	if ap.Supported {
		avg = fmt.Sprintf("average power (field 185) %.1f W", ap.First)
	}
	hasPower := true
	switch {
	case ip.Supported && ip.FreshTimestamp():
		r.add(SectionGPU, name+" power", OK, fmt.Sprintf("instant power (field 186) %.1f W, then %.1f W %v later with a fresh driver timestamp; %s",
			ip.First, ip.Second, gap, avg), "")
	case ip.Supported && ip.At1.IsZero():
		r.add(SectionGPU, name+" power", OK, fmt.Sprintf("instant power (field 186) %.1f W (the driver gives no timestamp; the agent uses its read time); %s",
			ip.First, avg), "")
	case ip.Supported:
		r.add(SectionGPU, name+" power", Warn, fmt.Sprintf("instant power (field 186) %.1f W, but its driver timestamp did not move in %v; %s",
			ip.First, gap, avg),
			"the driver repeats a stale value; the agent counts a repeated value once, so power has fewer samples than ticks")
	case g.PowerUsageError == "":
		r.add(SectionGPU, name+" power", Warn, fmt.Sprintf("instant power (field 186) not supported (%s): the agent falls back to GetPowerUsage, now %.1f W, the driver's 1 s average; %s",
			ip.Error, g.PowerUsageW, avg),
			"power spikes shorter than a second are smoothed; energy is still exact where the energy counter works")
	default:
		hasPower = false
		r.add(SectionGPU, name+" power", Warn, fmt.Sprintf("no power reading: field 186 (%s) and GetPowerUsage (%s) both fail", ip.Error, g.PowerUsageError),
			"this GPU does not report power to NVML (nvidia-smi -q -d POWER shows N/A)")
	}

	switch {
	case en.Supported && en.Advanced():
		d := en.Second - en.First
		r.add(SectionGPU, name+" energy", OK, fmt.Sprintf("energy counter (field 83) %.3f J, +%.3f J in %v (about %.0f W)",
			en.Second, d, gap, d/g.Gap.Seconds()), "")
	case en.Supported:
		r.add(SectionGPU, name+" energy", Warn, fmt.Sprintf("energy counter (field 83) %.3f J did not advance in %v", en.First, gap),
			"even an idle GPU draws tens of watts, so the counter should move; if it stays still the agent's energy comes out as zero: check nvidia-smi -q -d POWER and the driver version")
	case g.TotalEnergyError == "":
		r.add(SectionGPU, name+" energy", OK, fmt.Sprintf("energy counter field 83 not supported (%s); the agent reads it with GetTotalEnergyConsumption instead: %.3f J",
			en.Error, g.TotalEnergyJ), "")
	default:
		st := Warn
		hint := "energy is integrated from power samples instead (less exact); GPUs older than Volta have no energy counter"
		if !hasPower {
			st = Fail
			hint = "with neither power nor an energy counter this GPU's energy will be zero"
		}
		r.add(SectionGPU, name+" energy", st, fmt.Sprintf("no energy counter: field 83 (%s) and GetTotalEnergyConsumption (%s) both fail", en.Error, g.TotalEnergyError), hint)
	}

	switch {
	case !g.MigSupported:
		r.add(SectionGPU, name+" mig", OK, "MIG not supported by this GPU", "")
	case g.MigEnabled:
		r.add(SectionGPU, name+" mig", Warn, "MIG mode is enabled: energy per MIG instance is not measurable; trainmeter splits the whole GPU's energy between its runs by their instances' compute slices",
			"a run's share is an estimate by slices, not a measurement; for measured per-run energy give each run whole GPUs (nvidia-smi -i N -mig 0, then reset the GPU)")
	case g.MigPendingEnabled:
		r.add(SectionGPU, name+" mig", Warn, "MIG mode is disabled now but enabled after the next GPU reset",
			"once it is on, energy per MIG instance is not measurable; trainmeter reports the whole GPU's energy")
	default:
		r.add(SectionGPU, name+" mig", OK, "MIG mode disabled", "")
	}
}

// checkSimulated opens a sim or replay backend and reads it twice.
func checkSimulated(o Options, sp gpuopen.Spec, r *Report) {
	b, err := gpuopen.OpenWith(o.Config.GPU, gpuopen.Options{})
	if err != nil {
		r.add(SectionGPU, "backend", Fail, err.Error(), "")
		return
	}
	defer b.Close()
	devs := b.Devices()
	switch sp.Kind {
	case gpuopen.KindSim:
		r.add(SectionGPU, "backend", OK, fmt.Sprintf("simulated GPUs (sim:%d, seed %d): the numbers are synthetic, not measured", sp.N, sp.Seed), "")
	default:
		r.add(SectionGPU, "backend", OK, fmt.Sprintf("replay of %s (%s): the numbers are a recorded trace, not measured", sp.Path, plural.N(len(devs), "GPU")), "")
	}
	first, second, gap, readErr := o.readTwice(b, len(devs))
	for i, d := range devs {
		name := fmt.Sprintf("gpu %d", d.Index)
		desc := fmt.Sprintf("%s, %s, %d MiB, power limit %.0f W", d.Name, d.UUID, d.MemTotalMiB, d.PowerLimitW)
		if readErr != nil {
			r.add(SectionGPU, name, Fail, desc+": cannot be read: "+readErr.Error(), "")
			continue
		}
		a, b := first[i], second[i]
		var live []string
		if b.PowerOK {
			live = append(live, fmt.Sprintf("power %.1f W", b.PowerW))
		}
		if a.EnergyOK && b.EnergyOK {
			live = append(live, fmt.Sprintf("energy %.3f J, +%.3f J in %v", b.EnergyJ, b.EnergyJ-a.EnergyJ, gap.Round(time.Millisecond)))
		}
		if b.MemOK {
			live = append(live, fmt.Sprintf("memory %.0f/%.0f MiB", b.MemUsedMiB, b.MemTotalMiB))
		}
		switch {
		case b.Err != nil:
			r.add(SectionGPU, name, Warn, desc+"; "+strings.Join(live, ", ")+"; read error: "+b.Err.Error(), "")
		case len(live) == 0:
			r.add(SectionGPU, name, Warn, desc+"; no value in this part of the trace", "")
		default:
			r.add(SectionGPU, name, OK, desc+"; "+strings.Join(live, ", "), "")
		}
	}
}

// readTwice reads the n GPUs of b twice, o.Gap apart, as the checks judge a
// backend on: a counter that moves and power that is live, not one read.
// gap is the time between the reads; err the first read's error, else the
// second's.
func (o Options) readTwice(b gpu.Backend, n int) (first, second []gpu.Sample, gap time.Duration, err error) {
	first, second = make([]gpu.Sample, n), make([]gpu.Sample, n)
	t0 := o.clock().Now()
	err1 := b.Read(t0, first)
	o.wait(o.Gap)
	t1 := o.clock().Now()
	err2 := b.Read(t1, second)
	return first, second, t1.Sub(t0), cmp.Or(err1, err2)
}
