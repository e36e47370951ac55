package nvmlgpu

import (
	"fmt"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// FieldPowerAverage is NVML_FI_DEV_POWER_AVERAGE (185, mW): the driver's 1 s
// average, which Diagnose reports next to the fields the backend samples.
const FieldPowerAverage = nvml.FI_DEV_POWER_AVERAGE

// DefaultDiagnoseGap is the time between Diagnose's two live reads.
const DefaultDiagnoseGap = 200 * time.Millisecond

// Report is what Diagnose found: the NVML library, the driver, and each GPU.
type Report struct {
	// Init is what nvmlInit returned; InitError explains it in plain words
	// when it is not SUCCESS (the rest of the report is then empty).
	Init          nvml.Return
	InitError     string
	DriverVersion string // "" when NVML could not tell
	NVMLVersion   string // "" when NVML could not tell
	// CUDADriverVersion is nvmlSystemGetCudaDriverVersion (12040 for
	// 12.4); 0 when unknown.
	CUDADriverVersion int
	GPUs              []GPUReport
}

// CUDAVersionString formats CUDADriverVersion as "12.4" ("" when unknown).
func (r Report) CUDAVersionString() string {
	if r.CUDADriverVersion <= 0 {
		return ""
	}
	return fmt.Sprintf("%d.%d", r.CUDADriverVersion/1000, r.CUDADriverVersion%1000/10)
}

// GPUReport describes one GPU.
type GPUReport struct {
	Index int
	// Error is set when the GPU could not be opened at all (no handle, no
	// UUID); the other fields are then mostly empty.
	Error       string
	UUID, Name  string
	MemTotalMiB uint64
	MemUsedMiB  uint64
	PowerLimitW float64 // the enforced power limit; 0 when unknown

	// Fields the backend uses, probed with GetFieldValues and read twice
	// Gap apart: instant power (186), average power (185), energy (83).
	InstantPower FieldReport
	AveragePower FieldReport
	Energy       FieldReport
	Gap          time.Duration

	// Fallbacks the backend uses when a field is not supported:
	// GetPowerUsage (mW, 1 s average) and GetTotalEnergyConsumption (mJ).
	PowerUsageW       float64
	PowerUsageError   string // "" when GetPowerUsage works
	TotalEnergyJ      float64
	TotalEnergyError  string // "" when GetTotalEnergyConsumption works
	MigSupported      bool   // GetMigMode answered
	MigEnabled        bool   // current MIG mode is enabled
	MigPendingEnabled bool   // pending (after reset) MIG mode is enabled
	Persistence       string // "on", "off", or "" when unknown
}

// FieldReport is one NVML field on one GPU.
type FieldReport struct {
	ID        uint32
	Supported bool // the first read of the field succeeded
	// Error is the field's NVML return when not supported
	// ("ERROR_NOT_SUPPORTED"), or why its value could not be decoded.
	Error string
	// First and Second are the two live readings (W for power, J for
	// energy), At1 and At2 the driver's timestamps (zero when none).
	First, Second float64
	At1, At2      time.Time
	SecondOK      bool
}

// Advanced reports whether the second reading differs from the first.
func (f FieldReport) Advanced() bool { return f.Supported && f.SecondOK && f.Second != f.First }

// FreshTimestamp reports whether the driver's timestamp moved between the
// two readings (a repeated timestamp means a stale, repeated value).
func (f FieldReport) FreshTimestamp() bool {
	return f.Supported && f.SecondOK && !f.At1.IsZero() && f.At2.After(f.At1)
}

// DiagnoseOptions tunes Diagnose; the zero value is fine.
type DiagnoseOptions struct {
	Gap time.Duration // between the two live reads; default DefaultDiagnoseGap
	// Sleep waits between the two reads; default time.Sleep (tests inject
	// one that advances their mock).
	Sleep func(time.Duration)
}

// Diagnose initialises NVML through lib (nil: nvml.New()), reports the
// driver and every GPU with the fields it supports and two live readings,
// and shuts NVML down again. It is for `trainmeter-agent doctor`, not for
// the sampling path: it makes many NVML calls and sleeps Gap.
//
// The error is non-nil (and wraps ErrNoNVML when the library or driver is
// missing) when NVML cannot be used at all; the Report is filled as far as it
// got either way. Per-GPU problems are in the GPUReports, not the error.
func Diagnose(lib nvml.Interface, o DiagnoseOptions) (Report, error) {
	if lib == nil {
		lib = nvml.New()
	}
	if o.Gap <= 0 {
		o.Gap = DefaultDiagnoseGap
	}
	if o.Sleep == nil {
		o.Sleep = time.Sleep
	}
	var r Report
	r.Init = initReturn(lib)
	if r.Init != nvml.SUCCESS {
		r.InitError = explainInit(r.Init)
		return r, fmt.Errorf("%w: %s", ErrNoNVML, r.InitError)
	}
	defer lib.Shutdown()

	if v, ret := call(lib.SystemGetDriverVersion); ret == nvml.SUCCESS {
		r.DriverVersion = v
	}
	if v, ret := call(lib.SystemGetNVMLVersion); ret == nvml.SUCCESS {
		r.NVMLVersion = v
	}
	if v, ret := call(lib.SystemGetCudaDriverVersion); ret == nvml.SUCCESS {
		r.CUDADriverVersion = v
	}
	n, ret := call(lib.DeviceGetCount)
	if ret != nvml.SUCCESS {
		return r, fmt.Errorf("nvml: cannot count GPUs: %v", ret)
	}

	handles := make([]nvml.Device, n)
	for i := range n {
		g := GPUReport{Index: i, Gap: o.Gap}
		if h, ret := lib.DeviceGetHandleByIndex(i); ret != nvml.SUCCESS {
			g.Error = fmt.Sprintf("no handle: %v", ret)
		} else {
			handles[i] = h
			describe(h, &g)
		}
		r.GPUs = append(r.GPUs, g)
	}
	// Two reads of all GPUs, Gap apart.
	first := make([][]nvml.FieldValue, n)
	for i, h := range handles {
		if h != nil && r.GPUs[i].Error == "" {
			first[i] = readFields(h)
		}
	}
	o.Sleep(o.Gap)
	for i, h := range handles {
		if first[i] == nil {
			continue
		}
		g := &r.GPUs[i]
		second := readFields(h)
		g.InstantPower = fieldReport(FieldPowerInstant, first[i][0], second[0], 1e-3)
		g.AveragePower = fieldReport(FieldPowerAverage, first[i][1], second[1], 1e-3)
		g.Energy = fieldReport(FieldTotalEnergy, first[i][2], second[2], 1e-3)
	}
	return r, nil
}

// describe fills g's identity, memory, limits, fallbacks, MIG and
// persistence. Optional calls that fail (or are not implemented by a mock)
// leave their fields empty.
func describe(h nvml.Device, g *GPUReport) {
	var ret nvml.Return
	if g.UUID, ret = call(h.GetUUID); ret != nvml.SUCCESS {
		g.Error = fmt.Sprintf("cannot read its UUID: %v", ret)
		return
	}
	g.Name, _ = call(h.GetName)
	if mem, ret := call(h.GetMemoryInfo); ret == nvml.SUCCESS {
		g.MemTotalMiB, g.MemUsedMiB = mem.Total/mib, mem.Used/mib
	}
	if mw, ret := call(h.GetEnforcedPowerLimit); ret == nvml.SUCCESS {
		g.PowerLimitW = float64(mw) / 1000
	}
	if mw, ret := call(h.GetPowerUsage); ret == nvml.SUCCESS {
		g.PowerUsageW = float64(mw) / 1000
	} else {
		g.PowerUsageError = ret.Error()
	}
	if mj, ret := call(h.GetTotalEnergyConsumption); ret == nvml.SUCCESS {
		g.TotalEnergyJ = float64(mj) / 1000
	} else {
		g.TotalEnergyError = ret.Error()
	}
	if m, ret := call(func() ([2]int, nvml.Return) { c, p, r := h.GetMigMode(); return [2]int{c, p}, r }); ret == nvml.SUCCESS {
		g.MigSupported = true
		g.MigEnabled = m[0] == nvml.DEVICE_MIG_ENABLE
		g.MigPendingEnabled = m[1] == nvml.DEVICE_MIG_ENABLE
	}
	if st, ret := call(h.GetPersistenceMode); ret == nvml.SUCCESS {
		g.Persistence = "off"
		if st == nvml.FEATURE_ENABLED {
			g.Persistence = "on"
		}
	}
}

// readFields reads fields 186, 185 and 83 in one call; a failed call marks
// each value with the call's return.
func readFields(h nvml.Device) []nvml.FieldValue {
	fv := []nvml.FieldValue{{FieldId: FieldPowerInstant}, {FieldId: FieldPowerAverage}, {FieldId: FieldTotalEnergy}}
	ret := safeReturn(func() nvml.Return { return h.GetFieldValues(fv) })
	if ret != nvml.SUCCESS {
		for k := range fv {
			fv[k].NvmlReturn = uint32(ret)
		}
	}
	return fv
}

func fieldReport(id uint32, a, b nvml.FieldValue, scale float64) FieldReport {
	f := FieldReport{ID: id}
	if r := nvml.Return(a.NvmlReturn); r != nvml.SUCCESS {
		f.Error = r.Error()
		return f
	}
	v, ok := fieldValue(&a)
	if !ok {
		f.Error = fmt.Sprintf("value of unknown type %d", a.ValueType)
		return f
	}
	f.Supported, f.First, f.At1 = true, v*scale, fieldTime(&a)
	if nvml.Return(b.NvmlReturn) == nvml.SUCCESS {
		if v, ok := fieldValue(&b); ok {
			f.SecondOK, f.Second, f.At2 = true, v*scale, fieldTime(&b)
		}
	}
	return f
}

// explainInit says in plain words why NVML did not initialise.
func explainInit(ret nvml.Return) string {
	switch ret {
	case nvml.ERROR_LIBRARY_NOT_FOUND:
		return "libnvidia-ml.so.1 not found (ERROR_LIBRARY_NOT_FOUND): is the NVIDIA driver installed and its library on the loader path (ldconfig -p | grep libnvidia-ml)? In a container, run it with the NVIDIA container toolkit (--gpus all / runtime nvidia)"
	case nvml.ERROR_DRIVER_NOT_LOADED:
		return "the NVIDIA kernel driver is not loaded (ERROR_DRIVER_NOT_LOADED): is the nvidia module loaded (lsmod | grep nvidia), and does nvidia-smi work?"
	case nvml.ERROR_NO_PERMISSION:
		return "no permission to open the GPUs (ERROR_NO_PERMISSION): can this user open /dev/nvidia*?"
	case nvml.ERROR_LIB_RM_VERSION_MISMATCH:
		return "the NVIDIA library and kernel driver versions differ (ERROR_LIB_RM_VERSION_MISMATCH): the driver was upgraded without a reboot or module reload"
	case nvml.ERROR_FUNCTION_NOT_FOUND:
		return "libnvidia-ml.so.1 is too old for this agent (ERROR_FUNCTION_NOT_FOUND): upgrade the NVIDIA driver"
	}
	return fmt.Sprintf("NVML did not initialise: %v", ret)
}

// initReturn calls lib.Init, turning a panic (a broken installation) into
// ERROR_UNKNOWN.
func initReturn(lib nvml.Interface) (ret nvml.Return) {
	defer func() {
		if recover() != nil {
			ret = nvml.ERROR_UNKNOWN
		}
	}()
	return lib.Init()
}

// The wrappers below turn a panic into ERROR_NOT_SUPPORTED: go-nvml's mocks
// panic on a method whose func is not set, and a diagnosis must not crash
// over an optional call.

func safeReturn(f func() nvml.Return) nvml.Return {
	_, ret := call(func() (struct{}, nvml.Return) { return struct{}{}, f() })
	return ret
}

func call[T any](f func() (T, nvml.Return)) (v T, ret nvml.Return) {
	defer func() {
		if recover() != nil {
			ret = nvml.ERROR_NOT_SUPPORTED
		}
	}()
	return f()
}
