// Package gpu defines the small interface the agent samples GPUs through, and
// the reading it gets back. Backends live in subpackages: nvmlgpu, amdgpu,
// simgpu (synthetic GPUs) and replay (a CSV trace played in real time).
package gpu

import (
	"fmt"
	"math"
	"time"
)

// Device describes one GPU as the backend found it at start.
type Device struct {
	Index int
	UUID  string
	Name  string
	// Vendor is "nvidia", "amd", or "" where the backend does not say
	// (simulated GPUs, a replay trace without a vendor column).
	Vendor      string
	MemTotalMiB uint64
	PowerLimitW float64
	// HasEnergyCounter: the backend exposes a cumulative energy counter
	// (NVML field 83, gpu_metrics' accumulator).
	HasEnergyCounter bool
	// HasInstantPower: power is an instantaneous reading (NVML field 186),
	// not the driver's 1 s average.
	HasInstantPower bool
}

// Sample is one reading of one GPU at one tick. Each value carries the
// driver's own timestamp where the backend has one, so that repeated (stale)
// values can be recognised and not counted as new samples.
type Sample struct {
	Index  int
	ReadAt time.Time // when the agent read the sample (injected clock)

	PowerW  float64
	PowerAt time.Time // driver timestamp of PowerW; zero means "use ReadAt"
	PowerOK bool

	// EnergyJ is the cumulative counter in joules since the driver loaded,
	// as the driver reports it (not reset-corrected).
	EnergyJ  float64
	EnergyAt time.Time // driver timestamp of EnergyJ; zero means "use ReadAt"
	EnergyOK bool

	MemUsedMiB  float64
	MemTotalMiB float64
	MemOK       bool

	UtilPct float64
	UtilOK  bool

	// Err is the first error reading this GPU this tick, if any; the fields
	// whose OK flag is set are still valid.
	Err error
}

// MaxPowerW bounds what one GPU can draw. The largest accelerators draw
// under 3 kW; a reading above the bound is a garbled one (a driver glitch,
// an all-ones value such as 4,294,967 W from 0xFFFFFFFF mW), not a figure.
const MaxPowerW = 20_000

// maxMemMiB bounds a memory reading (1 EiB): past it, a garbled value.
const maxMemMiB = 1 << 40

// DropGarbled clears the OK flag of the readings no GPU can give (NaN,
// infinite, negative, power above MaxPowerW, utilization above 100 %, memory
// above 1 EiB) and returns how many it cleared: a garbled reading is a gap,
// not a figure (one all-ones power value would be a run's peak power). A
// garbled energy counter needs the previous reading to be told apart
// (pkg/energy does).
func (s *Sample) DropGarbled() (dropped int) {
	bad := func(v, max float64) bool { return !(v >= 0 && v <= max) } // NaN too
	for _, f := range [...]struct {
		ok  *bool
		bad bool
	}{
		{&s.PowerOK, bad(s.PowerW, MaxPowerW)},
		{&s.EnergyOK, bad(s.EnergyJ, math.MaxFloat64)},
		{&s.MemOK, bad(s.MemTotalMiB, maxMemMiB) || bad(s.MemUsedMiB, maxMemMiB)},
		{&s.UtilOK, bad(s.UtilPct, 100)},
	} {
		if *f.ok && f.bad {
			*f.ok = false
			dropped++
		}
	}
	return dropped
}

// Backend is a set of GPUs that can be read once per tick.
type Backend interface {
	// Devices lists the GPUs, in index order, as found at start.
	Devices() []Device
	// Read fills dst (len(dst) == len(Devices())) with one sample per GPU.
	// now is the tick time from the agent's clock. A returned error means no
	// GPU could be read this tick; per-GPU failures go in Sample.Err.
	Read(now time.Time, dst []Sample) error
	Close() error
}

// LoadSetter is implemented by simulated backends whose power follows the
// load the trainer reports, so the demo behaves like a real run.
type LoadSetter interface {
	// SetLoad sets the busy fraction (0..1) of GPU index.
	SetLoad(index int, load float64)
}

// CounterResumer is implemented by simulated backends, whose energy counter
// lives in the agent's process: a restarted agent hands them its
// predecessor's last counter, so it goes on counting across the restart as
// a real GPU's does and the agent can bridge the downtime.
type CounterResumer interface {
	// ResumeCounter continues GPU index's counter from counterJ, read at
	// at; called before the first Read. An index out of range is ignored.
	ResumeCounter(index int, counterJ float64, at time.Time)
}

// ProcessLister is implemented by backends that can list the PIDs running
// compute work on a GPU (NVML's running compute processes). The agent calls it
// at most once a second: in NVML it costs milliseconds.
type ProcessLister interface {
	ComputePIDs(index int) ([]uint32, error)
}

// MIGProcessLister is implemented by backends that can tell which MIG
// device of a GPU each compute process runs on, so that a process is found
// under the MIG device's UUID (MIG-…) where a scheduler names MIG devices
// (the kubelet's pod-resources API does). Like ComputePIDs it costs
// milliseconds: the agent calls it at most once a second.
type MIGProcessLister interface {
	// ComputeMIGs maps each compute process of GPU index that runs on one
	// of its MIG devices to that device's UUID; processes outside MIG are
	// absent (a GPU without MIG gives an empty map).
	ComputeMIGs(index int) (map[uint32]string, error)
}

// ProcessUse is what one process (or, from a replay trace, one run) did on
// a GPU: SM utilisation (%) and GPU memory (MiB), each with its OK flag.
type ProcessUse struct {
	SMPct  float64
	SMOK   bool
	MemMiB float64
	MemOK  bool
	// MIGSlices is the compute slices of the MIG GPU instance the process
	// runs in (0: not on a MIG instance). Runs on different instances of
	// one GPU share its power in proportion to their slices.
	MIGSlices   int
	MIGInstance uint32 // that instance's id (valid when MIGSlices > 0)
}

// ProcessUsageReader is implemented by backends that measure each
// process's use of a GPU (NVML: nvmlDeviceGetProcessUtilization, SM samples
// since a time, and the compute-process list for memory). The agent polls it
// at most once a second, off the sampling path, to split a shared GPU.
type ProcessUsageReader interface {
	ProcessUsage(index int, since time.Time) (map[uint32]ProcessUse, error)
}

// RunUsageReader is implemented by backends that state each run's use of a
// GPU directly (replay traces with per-run columns: docs/replay-format.md),
// so that the split of a shared GPU can be tested end to end.
type RunUsageReader interface {
	RunUsage(index int, now time.Time) map[string]ProcessUse
}

// ReadEach is the loop every hardware backend's Read shares: it resets
// each dst[i] to GPU i at now, lets read fill it, and returns an error
// only when no GPU gave any value (the first GPU's error, prefixed with
// the backend's name), so one bad card never hides the others' figures.
func ReadEach(backend string, now time.Time, dst []Sample, read func(i int, s *Sample)) error {
	anyOK := false
	var firstErr error
	for i := range dst {
		s := &dst[i]
		*s = Sample{Index: i, ReadAt: now}
		read(i, s)
		anyOK = anyOK || s.PowerOK || s.EnergyOK || s.MemOK || s.UtilOK
		if firstErr == nil {
			firstErr = s.Err
		}
	}
	if !anyOK && firstErr != nil {
		return fmt.Errorf("%s: no GPU could be read: %w", backend, firstErr)
	}
	return nil
}
