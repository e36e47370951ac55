// Package nvmlgpu is the NVIDIA GPU backend, over go-nvml's nvml.Interface
// (tests inject its mocks). Per GPU per tick it makes one GetFieldValues
// call carrying the instant power (field 186, mW) and the cumulative energy
// counter (field 83, mJ), and uses each field's own timestamp (µs since the
// epoch) as PowerAt/EnergyAt, so repeated stale values can be recognised
// downstream. Where a field is not supported (probed at start) it falls back
// to GetPowerUsage (a 1 s average on Ampere and newer) and
// GetTotalEnergyConsumption.
package nvmlgpu

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/trainmeter/trainmeter/pkg/gpu"
)

// NVML field ids this backend reads.
const (
	FieldPowerInstant = nvml.FI_DEV_POWER_INSTANT            // 186, mW
	FieldTotalEnergy  = nvml.FI_DEV_TOTAL_ENERGY_CONSUMPTION // 83, mJ
)

// ErrNoNVML is wrapped by New's error when the NVML library or the NVIDIA
// driver cannot be found.
var ErrNoNVML = errors.New("NVML/driver not found")

const mib = 1 << 20

// source is where a GPU's power or energy comes from.
type source uint8

const (
	srcNone  source = iota
	srcField        // the field (186 or 83) in the GetFieldValues call
	srcCall         // the fallback call: GetPowerUsage (1 s average on Ampere+), GetTotalEnergyConsumption
)

type device struct {
	h      nvml.Device
	power  source
	energy source
	// ids are the field ids requested each tick; fv is the reused buffer
	// (len(fv) == len(ids)); powerIdx/energyIdx index into it, or -1.
	ids       []uint32
	fv        []nvml.FieldValue
	powerIdx  int
	energyIdx int
	// migSlices caches MIG GPU instance id -> compute slices; only
	// ProcessUsage (the agent's one share poller) touches it.
	migSlices map[uint32]int
}

// Backend reads real GPUs through NVML. It implements gpu.Backend,
// gpu.ProcessLister and gpu.MIGProcessLister and is safe for concurrent use.
type Backend struct {
	lib  nvml.Interface
	log  *slog.Logger
	devs []gpu.Device

	mu     sync.Mutex // guards gpus' buffers and closed
	gpus   []*device
	closed bool

	migMu sync.Mutex // guards migUUIDs
	// migUUIDs is, per GPU, the UUIDs of the MIG devices its compute
	// processes were on at the last ComputeMIGs (nil: none).
	migUUIDs []map[migKey]string
}

// migKey names a MIG device on its GPU: its GPU instance and compute
// instance (a GPU instance split into compute instances is several MIG
// devices).
type migKey struct{ gi, ci uint32 }

// New initialises NVML through lib (nvml.New() in production; nil means
// that), enumerates the GPUs and probes which fields each supports. The
// returned error wraps ErrNoNVML when the library or driver is missing.
func New(lib nvml.Interface, logger *slog.Logger) (*Backend, error) {
	if lib == nil {
		lib = nvml.New()
	}
	logger = cmp.Or(logger, slog.New(slog.DiscardHandler))
	if err := initLib(lib); err != nil {
		return nil, err
	}
	b := &Backend{lib: lib, log: logger}
	if err := b.enumerate(); err != nil {
		lib.Shutdown()
		return nil, err
	}
	return b, nil
}

func initLib(lib nvml.Interface) (err error) {
	// go-nvml's real Init loads libnvidia-ml.so.1 with dlopen; guard against
	// a panic from a broken installation all the same.
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w (nvml init panicked: %v); to run without a GPU use --gpu sim:2", ErrNoNVML, r)
		}
	}()
	switch ret := lib.Init(); ret {
	case nvml.SUCCESS:
		return nil
	case nvml.ERROR_LIBRARY_NOT_FOUND, nvml.ERROR_DRIVER_NOT_LOADED:
		return fmt.Errorf("%w: cannot initialise NVML (%v): is the NVIDIA driver installed and libnvidia-ml.so.1 on the library path? To run without a GPU use --gpu sim:2 (simulated GPUs) or --gpu replay:FILE",
			ErrNoNVML, ret)
	default:
		return fmt.Errorf("nvml init: %v; to run without a GPU use --gpu sim:2", ret)
	}
}

func (b *Backend) enumerate() error {
	n, ret := b.lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return fmt.Errorf("nvml: device count: %v", ret)
	}
	if n == 0 {
		return errors.New("nvml: no GPUs found; to run without a GPU use --gpu sim:2")
	}
	for i := range n {
		h, ret := b.lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			return fmt.Errorf("nvml: gpu %d: handle: %v", i, ret)
		}
		uuid, ret := h.GetUUID()
		if ret != nvml.SUCCESS {
			return fmt.Errorf("nvml: gpu %d: uuid: %v", i, ret)
		}
		name, ret := h.GetName()
		if ret != nvml.SUCCESS {
			return fmt.Errorf("nvml: gpu %d (%s): name: %v", i, uuid, ret)
		}
		d := gpu.Device{Index: i, UUID: uuid, Name: name, Vendor: "nvidia"}
		if mem, ret := h.GetMemoryInfo(); ret == nvml.SUCCESS {
			d.MemTotalMiB = mem.Total / mib
		} else {
			b.log.Warn("nvml: cannot read memory total", "gpu", i, "uuid", uuid, "err", ret.Error())
		}
		if mw, ret := h.GetEnforcedPowerLimit(); ret == nvml.SUCCESS {
			d.PowerLimitW = float64(mw) / 1000
		} else {
			b.log.Warn("nvml: cannot read enforced power limit", "gpu", i, "uuid", uuid, "err", ret.Error())
		}

		dev := b.probe(i, uuid, h)
		d.HasInstantPower = dev.power == srcField
		d.HasEnergyCounter = dev.energy != srcNone
		b.devs = append(b.devs, d)
		b.gpus = append(b.gpus, dev)
	}
	return nil
}

// probe finds out which fields GPU i supports and sets up its fallbacks.
func (b *Backend) probe(i int, uuid string, h nvml.Device) *device {
	fv := []nvml.FieldValue{{FieldId: FieldPowerInstant}, {FieldId: FieldTotalEnergy}}
	ret := h.GetFieldValues(fv)
	powerRet, energyRet := ret, ret
	if ret == nvml.SUCCESS {
		powerRet, energyRet = nvml.Return(fv[0].NvmlReturn), nvml.Return(fv[1].NvmlReturn)
	}
	dev := &device{h: h, powerIdx: -1, energyIdx: -1}
	dev.power = b.pick(i, uuid, "instant power field", FieldPowerInstant, powerRet, "GetPowerUsage (1 s average on Ampere and newer)",
		func() nvml.Return { _, r := h.GetPowerUsage(); return r },
		"nvml: GPU reports no power: instant power field and GetPowerUsage both fail")
	dev.energy = b.pick(i, uuid, "energy counter field", FieldTotalEnergy, energyRet, "GetTotalEnergyConsumption",
		func() nvml.Return { _, r := h.GetTotalEnergyConsumption(); return r },
		"nvml: GPU has no energy counter; energy will be integrated from power samples only")
	if dev.power == srcField {
		dev.powerIdx = len(dev.ids)
		dev.ids = append(dev.ids, FieldPowerInstant)
	}
	if dev.energy == srcField {
		dev.energyIdx = len(dev.ids)
		dev.ids = append(dev.ids, FieldTotalEnergy)
	}
	dev.fv = make([]nvml.FieldValue, len(dev.ids))
	return dev
}

// pick is how GPU i reads one value: its field, where the probe read it or
// failed transiently (only NOT_SUPPORTED and the like say a field is
// missing: a transient ERROR_UNKNOWN at the agent's start must not switch
// the GPU to a fallback for the agent's life, its reads report the error);
// else the fallback call where that answers; else nothing.
func (b *Backend) pick(i int, uuid, what string, id uint32, ret nvml.Return, fallbackName string, fallback func() nvml.Return, noneMsg string) source {
	if ret == nvml.SUCCESS || ret == nvml.ERROR_UNKNOWN || ret == nvml.ERROR_TIMEOUT {
		if ret != nvml.SUCCESS {
			b.log.Warn("nvml: "+what+" failed while probing; keeping it, its reads will say whether it recovers",
				"gpu", i, "uuid", uuid, "field", id, "err", ret.Error())
		}
		return srcField
	}
	if r := fallback(); r != nvml.SUCCESS {
		b.log.Warn(noneMsg, "gpu", i, "uuid", uuid, "field_err", ret.Error(), "err", r.Error())
		return srcNone
	}
	b.log.Warn("nvml: "+what+" not supported; falling back to "+fallbackName, "gpu", i, "uuid", uuid, "field", id, "err", ret.Error())
	return srcCall
}

// Devices implements gpu.Backend.
func (b *Backend) Devices() []gpu.Device { return slices.Clone(b.devs) }

// Read implements gpu.Backend. It returns an error only when no value of any
// GPU could be read; per-GPU and per-field failures go in Sample.Err.
func (b *Backend) Read(now time.Time, dst []gpu.Sample) error {
	if len(dst) != len(b.gpus) {
		return fmt.Errorf("nvmlgpu: Read: len(dst) = %d, want %d", len(dst), len(b.gpus))
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return errors.New("nvmlgpu: Read after Close")
	}
	return gpu.ReadEach("nvmlgpu", now, dst, func(i int, s *gpu.Sample) { b.gpus[i].read(i, s) })
}

// read fills s from GPU i. It never panics on NVML errors; the first error
// goes in s.Err.
func (d *device) read(i int, s *gpu.Sample) {
	fail := func(what string, ret nvml.Return) {
		if s.Err == nil {
			s.Err = &ReadError{GPU: i, What: what, Ret: ret}
		}
	}

	if len(d.fv) > 0 {
		for k, id := range d.ids {
			d.fv[k] = nvml.FieldValue{FieldId: id}
		}
		ret := d.h.GetFieldValues(d.fv)
		if ret != nvml.SUCCESS {
			fail("field values", ret)
			if ret == nvml.ERROR_GPU_IS_LOST {
				return // every other call would fail the same way
			}
		} else {
			if d.powerIdx >= 0 {
				s.PowerW, s.PowerAt, s.PowerOK = readField(&d.fv[d.powerIdx], "power", fail)
			}
			if d.energyIdx >= 0 {
				s.EnergyJ, s.EnergyAt, s.EnergyOK = readField(&d.fv[d.energyIdx], "energy", fail)
			}
		}
	}
	if d.power == srcCall {
		if mw, ret := d.h.GetPowerUsage(); ret == nvml.SUCCESS {
			s.PowerW, s.PowerOK = float64(mw)/1000, true
		} else {
			fail("power usage", ret)
		}
	}
	if d.energy == srcCall {
		if mj, ret := d.h.GetTotalEnergyConsumption(); ret == nvml.SUCCESS {
			s.EnergyJ, s.EnergyOK = float64(mj)/1000, true
		} else {
			fail("total energy consumption", ret)
		}
	}
	if mem, ret := d.h.GetMemoryInfo(); ret == nvml.SUCCESS {
		s.MemUsedMiB, s.MemTotalMiB, s.MemOK = float64(mem.Used)/mib, float64(mem.Total)/mib, true
	} else {
		fail("memory info", ret)
		if ret == nvml.ERROR_GPU_IS_LOST {
			return
		}
	}
	if u, ret := d.h.GetUtilizationRates(); ret == nvml.SUCCESS {
		s.UtilPct, s.UtilOK = float64(u.Gpu), true
	} else {
		fail("utilization", ret)
	}
}

// readField is a field's value, scaled from milli-units, and timestamp;
// a failure goes to fail.
func readField(f *nvml.FieldValue, what string, fail func(string, nvml.Return)) (float64, time.Time, bool) {
	if r := nvml.Return(f.NvmlReturn); r != nvml.SUCCESS {
		fail(what+" field", r)
	} else if v, ok := fieldValue(f); ok {
		return v / 1000, fieldTime(f), true
	} else {
		fail(what+" field value type", nvml.ERROR_UNKNOWN)
	}
	return 0, time.Time{}, false
}

// fieldTime converts a field's timestamp (µs since the epoch) to a time;
// zero stays zero ("use ReadAt").
func fieldTime(f *nvml.FieldValue) time.Time {
	if f.Timestamp <= 0 {
		return time.Time{}
	}
	return time.UnixMicro(f.Timestamp)
}

// fieldValue decodes a field's value union according to its ValueType.
// NVML writes it in the host's byte order.
func fieldValue(f *nvml.FieldValue) (float64, bool) {
	v := f.Value[:]
	switch nvml.ValueType(f.ValueType) {
	case nvml.VALUE_TYPE_DOUBLE:
		x := math.Float64frombits(binary.NativeEndian.Uint64(v))
		return x, !math.IsNaN(x) && !math.IsInf(x, 0)
	case nvml.VALUE_TYPE_UNSIGNED_INT:
		return float64(binary.NativeEndian.Uint32(v)), true
	case nvml.VALUE_TYPE_UNSIGNED_LONG, nvml.VALUE_TYPE_UNSIGNED_LONG_LONG:
		return float64(binary.NativeEndian.Uint64(v)), true
	case nvml.VALUE_TYPE_SIGNED_LONG_LONG:
		return float64(int64(binary.NativeEndian.Uint64(v))), true
	case nvml.VALUE_TYPE_SIGNED_INT:
		return float64(int32(binary.NativeEndian.Uint32(v))), true
	case nvml.VALUE_TYPE_UNSIGNED_SHORT:
		return float64(binary.NativeEndian.Uint16(v)), true
	}
	return 0, false
}

// ReadError is the Sample.Err of a failed NVML call.
type ReadError struct {
	GPU  int
	What string
	Ret  nvml.Return
}

func (e *ReadError) Error() string {
	return fmt.Sprintf("nvml: gpu %d: %s: %v", e.GPU, e.What, e.Ret)
}

// Unwrap lets errors.Is(err, nvml.ERROR_GPU_IS_LOST) work.
func (e *ReadError) Unwrap() error { return e.Ret }

// ComputePIDs implements gpu.ProcessLister with GetComputeRunningProcesses.
// It costs milliseconds in the driver: call it at most once a second.
func (b *Backend) ComputePIDs(index int) ([]uint32, error) {
	procs, err := b.computeProcs(index)
	if err != nil {
		return nil, err
	}
	pids := make([]uint32, len(procs))
	for k, p := range procs {
		pids[k] = p.Pid
	}
	return pids, nil
}

func (b *Backend) computeProcs(index int) ([]nvml.ProcessInfo, error) {
	if index < 0 || index >= len(b.gpus) {
		return nil, fmt.Errorf("nvmlgpu: no GPU %d", index)
	}
	procs, ret := b.gpus[index].h.GetComputeRunningProcesses()
	if ret != nvml.SUCCESS {
		return nil, &ReadError{GPU: index, What: "compute running processes", Ret: ret}
	}
	return procs, nil
}

// ProcessUsage implements gpu.ProcessUsageReader: each compute process's
// GPU memory (the compute-process list) and its mean SM utilisation over
// the samples NVML kept since since (nvmlDeviceGetProcessUtilization). A
// GPU without per-process utilisation (NOT_SUPPORTED, or MIG) or with no
// sample yet (NOT_FOUND) still gives memory. Like ComputePIDs it costs
// milliseconds: call it at most once a second.
func (b *Backend) ProcessUsage(index int, since time.Time) (map[uint32]gpu.ProcessUse, error) {
	procs, err := b.computeProcs(index)
	if err != nil {
		return nil, err
	}
	out := make(map[uint32]gpu.ProcessUse, len(procs))
	for _, p := range procs {
		u := out[p.Pid]
		u.MemMiB += float64(p.UsedGpuMemory) / (1 << 20)
		u.MemOK = true
		if p.GpuInstanceId != noInstance {
			if n := b.migSlices(index, p.GpuInstanceId); n > 0 {
				u.MIGSlices, u.MIGInstance = n, p.GpuInstanceId
			}
		}
		out[p.Pid] = u
	}
	var ts uint64
	if !since.IsZero() {
		ts = uint64(since.UnixMicro())
	}
	samples, ret := b.gpus[index].h.GetProcessUtilization(ts)
	if ret != nvml.SUCCESS {
		return out, nil
	}
	// Listed processes without a sample since then did no SM work.
	n := map[uint32]int{}
	for _, s := range samples {
		u := out[s.Pid]
		u.SMPct += float64(s.SmUtil)
		out[s.Pid] = u
		n[s.Pid]++
	}
	for pid, u := range out {
		u.SMOK = true
		if n[pid] > 0 {
			u.SMPct /= float64(n[pid])
		}
		out[pid] = u
	}
	return out, nil
}

// ComputeMIGs implements gpu.MIGProcessLister: the UUID of the MIG device
// each compute process of GPU index runs on (its GPU and compute instance
// ids, from GetComputeRunningProcesses, matched to the GPU's MIG device
// handles). The instances' UUIDs are cached while processes run on them and
// read again from NVML when a process is on an instance not seen on the
// last call: an instance can only be destroyed and created anew (a new
// UUID under the same ids) while no process runs on it. A process whose
// instance NVML names no MIG device for is absent.
func (b *Backend) ComputeMIGs(index int) (map[uint32]string, error) {
	procs, err := b.computeProcs(index)
	if err != nil {
		return nil, err
	}
	b.migMu.Lock()
	defer b.migMu.Unlock()
	if b.migUUIDs == nil {
		b.migUUIDs = make([]map[migKey]string, len(b.gpus))
	}
	cached := b.migUUIDs[index]
	used := map[migKey]string{}
	out := map[uint32]string{}
	reread := false
	for _, p := range procs {
		if p.GpuInstanceId == noInstance {
			continue
		}
		k := migKey{p.GpuInstanceId, p.ComputeInstanceId}
		uuid, ok := cached[k]
		if !ok && !reread {
			cached, reread = b.readMIGs(index), true
			uuid, ok = cached[k]
		}
		if ok {
			out[p.Pid] = uuid
			used[k] = uuid
		}
	}
	b.migUUIDs[index] = used
	return out, nil
}

// readMIGs is the UUID of each MIG device of GPU index, by its instance
// ids; empty where the GPU has no MIG devices or NVML cannot tell.
func (b *Backend) readMIGs(index int) map[migKey]string {
	out := map[migKey]string{}
	h := b.gpus[index].h
	n, ret := h.GetMaxMigDeviceCount()
	if ret != nvml.SUCCESS {
		return out
	}
	for i := range n {
		m, ret := h.GetMigDeviceHandleByIndex(i)
		if ret != nvml.SUCCESS {
			continue // NOT_FOUND: no MIG device in this slot
		}
		gi, ret := m.GetGpuInstanceId()
		if ret != nvml.SUCCESS {
			continue
		}
		ci, ret := m.GetComputeInstanceId()
		if ret != nvml.SUCCESS {
			continue
		}
		uuid, ret := m.GetUUID()
		if ret != nvml.SUCCESS {
			b.log.Debug("nvml: cannot read a MIG device's UUID", "gpu", index, "gpu_instance", gi, "compute_instance", ci, "err", ret.Error())
			continue
		}
		out[migKey{uint32(gi), uint32(ci)}] = uuid
	}
	return out
}

// noInstance is the GPU instance id NVML gives a process outside MIG.
const noInstance = 0xFFFFFFFF

// migSlices is the compute-slice count of MIG GPU instance id on GPU index
// (its profile's SliceCount), cached; 0 when NVML cannot tell.
func (b *Backend) migSlices(index int, id uint32) int {
	d := b.gpus[index]
	if n, ok := d.migSlices[id]; ok {
		return n
	}
	n := 0
	if gi, ret := d.h.GetGpuInstanceById(int(id)); ret == nvml.SUCCESS {
		if info, ret := gi.GetInfo(); ret == nvml.SUCCESS {
			for p := 0; p < nvml.GPU_INSTANCE_PROFILE_COUNT; p++ {
				if pi, ret := d.h.GetGpuInstanceProfileInfo(p); ret == nvml.SUCCESS && pi.Id == info.ProfileId {
					n = int(pi.SliceCount)
					break
				}
			}
		}
	}
	if d.migSlices == nil {
		d.migSlices = map[uint32]int{}
	}
	d.migSlices[id] = n
	return n
}

// Close shuts NVML down. Further Reads fail; a second Close does nothing.
func (b *Backend) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil
	}
	b.closed = true
	if ret := b.lib.Shutdown(); ret != nvml.SUCCESS {
		return fmt.Errorf("nvml shutdown: %v", ret)
	}
	return nil
}

var (
	_ gpu.Backend          = (*Backend)(nil)
	_ gpu.ProcessLister    = (*Backend)(nil)
	_ gpu.MIGProcessLister = (*Backend)(nil)
)
