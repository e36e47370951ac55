package doctor

import (
	"cmp"
	"fmt"
	"strings"
	"time"

	"github.com/trainmeter/trainmeter/internal/gpu/amdgpu"
	"github.com/trainmeter/trainmeter/internal/gpu/amdgpu/amdsmi"
	"github.com/trainmeter/trainmeter/internal/plural"
	"github.com/trainmeter/trainmeter/pkg/gpu"
)

const amdNoCardHint = "lsmod | grep amdgpu shows whether the driver is loaded and ls /sys/class/drm lists its cards; in a container, pass /dev/dri and /dev/kfd and mount the host's /sys. " + noGPUHint

// autoPicksAMD is --gpu auto's choice as the agent makes it: amd when the
// node has amdgpu cards and no NVIDIA GPU on the PCI bus.
func autoPicksAMD(o Options) bool {
	sysfs := cmp.Or(o.Config.SysfsRoot, "/sys")
	cards, _ := amdgpu.FindCards(sysfs)
	return len(cards) > 0 && !amdgpu.HasNVIDIA(sysfs)
}

// checkAMD opens the amd backend on the configured sysfs/procfs, reads every
// card twice o.Gap apart, and says where power and energy come from, whether
// the energy counter agrees with power (the agent's own check, over the
// gap), and whether per-process usage can be read.
func checkAMD(o Options, auto bool, r *Report) {
	sysfs, procfs := cmp.Or(o.Config.SysfsRoot, "/sys"), cmp.Or(o.Config.ProcfsRoot, "/proc")
	opt := amdgpu.Options{SysfsRoot: sysfs, ProcfsRoot: procfs, CheckSpan: o.Gap}
	lib, smiErr := amdsmi.Open("")
	if smiErr == nil {
		opt.SMI = lib
	}
	b, err := amdgpu.New(opt)
	if err != nil {
		if lib != nil {
			lib.Close()
		}
		r.add(SectionGPU, "amdgpu", Fail, err.Error(), amdNoCardHint)
		return
	}
	defer b.Close()
	devs := b.Devices()
	var cards []string
	for i := range devs {
		s := b.Sources(i)
		cards = append(cards, fmt.Sprintf("%s (%s)", s.Card, s.PCI))
	}
	msg := fmt.Sprintf("%s under %s: %s", plural.N(len(devs), "amdgpu card"), sysfs, strings.Join(cards, ", "))
	if auto {
		msg = "--gpu auto found no NVIDIA GPU and uses amd: " + msg
	}
	r.add(SectionGPU, "amdgpu", OK, msg, "")

	first, second, gap, readErr := o.readTwice(b, len(devs))
	for i, d := range devs {
		name := fmt.Sprintf("gpu %d", d.Index)
		src := b.Sources(i)
		desc := []string{d.Name, d.UUID}
		if d.MemTotalMiB > 0 {
			desc = append(desc, fmt.Sprintf("%d MiB", d.MemTotalMiB))
		}
		if d.PowerLimitW > 0 {
			desc = append(desc, fmt.Sprintf("power cap %.0f W", d.PowerLimitW))
		}
		if src.Metrics != "" {
			desc = append(desc, "gpu_metrics v"+src.Metrics)
		}
		if err := cmp.Or(readErr, first[i].Err, second[i].Err); err != nil {
			r.add(SectionGPU, name, Fail, strings.Join(desc, ", ")+": cannot be read: "+err.Error(),
				"the amdgpu sysfs files are world-readable, so \"operation not permitted\" comes from the driver: the card is runtime-suspended (idle, powered off: cat /sys/class/drm/"+src.Card+"/device/power/runtime_status) or in reset; \"permission denied\" means a restricted /sys (container, SELinux/AppArmor profile)")
			continue
		}
		r.add(SectionGPU, name, OK, strings.Join(desc, ", "), "")
		hasPower := amdPowerCheck(name, src, second[i], d.HasEnergyCounter, r)
		amdEnergyCheck(name, src, first[i], second[i], gap, hasPower, r)
	}
	amdSMICheck(b, lib, smiErr, r)
	amdProcessCheck(procfs, r)
}

// amdSMICheck says whether libamd_smi was loaded, and whether that matters:
// it only adds a counter where sysfs has none.
func amdSMICheck(b *amdgpu.Backend, lib *amdsmi.Lib, smiErr error, r *Report) {
	var fromSMI, without []string
	for i := range b.Devices() {
		src := b.Sources(i)
		switch {
		case strings.HasPrefix(src.CounterSource, "amd-smi"):
			fromSMI = append(fromSMI, src.Card)
		case !src.Counter:
			without = append(without, src.Card)
		}
	}
	switch {
	case smiErr == nil:
		msg := fmt.Sprintf("%s loaded, %s", lib.Path(), plural.N(lib.GPUs(), "GPU"))
		if len(fromSMI) > 0 {
			msg += "; energy counter from it for " + strings.Join(fromSMI, ", ")
		}
		r.add(SectionGPU, "amd-smi", OK, msg, "")
	case len(without) == 0:
		r.add(SectionGPU, "amd-smi", OK, "libamd_smi.so not installed; not needed: every card's gpu_metrics has an energy accumulator", "")
	default:
		r.add(SectionGPU, "amd-smi", Warn, "libamd_smi.so not installed, and without it these cards have no energy counter (their energy is the power integral): "+strings.Join(without, ", "),
			"where ROCm's AMD SMI library (libamd_smi.so, package amd-smi-lib) is installed the agent loads it at start and uses its counter for the cards it knows; the agent runs without it")
	}
}

func amdPowerCheck(name string, src amdgpu.Sources, s gpu.Sample, counter bool, r *Report) bool {
	switch src.Power {
	case "hwmon power1_input":
		r.add(SectionGPU, name+" power", OK, fmt.Sprintf("hwmon power1_input %.1f W (the SMU's current socket power)", s.PowerW), "")
	case "hwmon power1_average":
		st, hint := OK, ""
		if !counter {
			st, hint = Warn, "with no energy counter, energy is the integral of this average: spikes shorter than a second are smoothed (docs/measurement.md, \"AMD GPUs\")"
		}
		r.add(SectionGPU, name+" power", st, fmt.Sprintf("hwmon power1_average %.1f W (the SMU's 1 s average; this kernel has no power1_input)", s.PowerW), hint)
	case "gpu_metrics":
		r.add(SectionGPU, name+" power", Warn, fmt.Sprintf("no hwmon power file (%s); power from gpu_metrics' socket power: %.1f W", src.PowerError, s.PowerW),
			"an APU's socket power includes its CPU cores; a discrete card without hwmon power needs a newer kernel")
	default:
		st := Warn
		if !counter {
			st = Fail
		}
		r.add(SectionGPU, name+" power", st, "no power reading: "+cmp.Or(src.PowerError, "no hwmon power1_input/power1_average")+"; gpu_metrics: "+cmp.Or(src.MetricsError, "no socket power"),
			"amdgpu exposes power under hwmon when its power management (SMU) is up: check dmesg | grep -i amdgpu and that amdgpu.dpm is not 0")
		return false
	}
	return true
}

func amdEnergyCheck(name string, src amdgpu.Sources, a, b gpu.Sample, gap time.Duration, hasPower bool, r *Report) {
	chk := src.Check
	switch chk.State {
	case amdgpu.CheckNoCounter:
		what := "gpu_metrics unreadable (" + src.MetricsError + ")"
		if src.Metrics != "" {
			what = "gpu_metrics v" + src.Metrics + " has no energy accumulator, or the firmware leaves it unfilled"
		}
		if !hasPower {
			r.add(SectionGPU, name+" energy", Fail, "no energy counter: "+what, "with neither power nor an energy counter this GPU's energy will be zero")
			return
		}
		r.add(SectionGPU, name+" energy", Warn, "no energy counter: "+what+"; energy is integrated from power samples",
			"consumer Radeon firmware does not fill the accumulator; Instinct boards do. Where libamd_smi is installed the agent could read its counter instead (docs/measurement.md)")
	case amdgpu.CheckAgreed:
		r.add(SectionGPU, name+" energy", OK, fmt.Sprintf("energy accumulator (gpu_metrics v%s) %.3f J, +%.3f J in %.0f ms; power says %.3f J: they agree, the agent uses the counter",
			src.Metrics, b.EnergyJ, chk.CounterJ, 1000*gap.Seconds(), chk.IntegratedJ), "")
	case amdgpu.CheckNoPower:
		r.add(SectionGPU, name+" energy", Warn, fmt.Sprintf("energy accumulator (gpu_metrics v%s) +%.3f J in %.0f ms, but no power reading to check it against", src.Metrics, chk.CounterJ, 1000*gap.Seconds()),
			"the agent uses the counter unchecked; some AMD firmware fills it wrongly, so compare a run's energy with the board's rating once")
	case amdgpu.CheckDisagreed:
		r.add(SectionGPU, name+" energy", Warn, fmt.Sprintf("energy accumulator (gpu_metrics v%s) moved %+.3f J in %.0f ms while power says %.3f J: the counter is wrong on this firmware, the agent drops it and integrates power",
			src.Metrics, chk.CounterJ, 1000*gap.Seconds(), chk.IntegratedJ),
			"a firmware (PMFW) or kernel update may fix the accumulator; until then energy is the power integral (less exact for loads that change faster than the power sensor)")
	default:
		r.add(SectionGPU, name+" energy", Warn, fmt.Sprintf("energy accumulator not checked yet (%s)", chk.State), "")
	}
}

func amdProcessCheck(procfs string, r *Report) {
	readable, denied, err := amdgpu.FdinfoAccess(procfs)
	switch {
	case err != nil:
		r.add(SectionGPU, "process usage", Warn, "cannot list "+procfs+": "+err.Error(),
			"without /proc the agent cannot attribute GPUs to a wrapped command's processes nor split a shared GPU by use")
	case denied > 0:
		r.add(SectionGPU, "process usage", Warn, fmt.Sprintf("/proc/PID/fdinfo of %d of %d processes is not readable by this user", denied, readable+denied),
			"reading another user's fdinfo needs the same uid or CAP_SYS_PTRACE: give the agent's unit AmbientCapabilities=CAP_SYS_PTRACE (docs/deploy.md) or GPUs shared by runs are split equally and trainmeter run cannot find the GPUs its command uses")
	default:
		r.add(SectionGPU, "process usage", OK, fmt.Sprintf("/proc/PID/fdinfo readable for all %d processes (DRM clients: drm-engine-gfx, drm-memory-vram)", readable), "")
	}
}
