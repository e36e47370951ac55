package nvmlgpu

import (
	"bytes"
	"encoding/binary"
	"errors"
	"log/slog"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"

	"github.com/trainmeter/trainmeter/pkg/gpu"
)

var now = time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)

// fake is the state behind one mocked GPU.
type fake struct {
	mu sync.Mutex

	powerMW  uint32
	energyMJ uint64
	powerTS  int64 // µs since epoch
	energyTS int64

	// field support / per-field returns; SUCCESS when unset
	powerRet, energyRet nvml.Return
	// device-level return of GetFieldValues
	callRet nvml.Return

	usageMW     uint32 // GetPowerUsage
	usageRet    nvml.Return
	totalMJ     uint64 // GetTotalEnergyConsumption
	totalRet    nvml.Return
	memUsed     uint64
	memRet      nvml.Return
	util        uint32
	utilRet     nvml.Return
	limitMW     uint32
	fieldCalls  int
	fieldCounts []int // len(values) of each GetFieldValues call
}

func putU32(v *[8]byte, x uint32) { binary.NativeEndian.PutUint32(v[:], x) }
func putU64(v *[8]byte, x uint64) { binary.NativeEndian.PutUint64(v[:], x) }

func (f *fake) getFieldValues(values []nvml.FieldValue) nvml.Return {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fieldCalls++
	f.fieldCounts = append(f.fieldCounts, len(values))
	if f.callRet != nvml.SUCCESS {
		return f.callRet
	}
	for k := range values {
		v := &values[k]
		switch v.FieldId {
		case nvml.FI_DEV_POWER_INSTANT:
			v.NvmlReturn = uint32(f.powerRet)
			if f.powerRet == nvml.SUCCESS {
				v.ValueType = uint32(nvml.VALUE_TYPE_UNSIGNED_INT)
				v.Timestamp = f.powerTS
				putU32(&v.Value, f.powerMW)
			}
		case nvml.FI_DEV_TOTAL_ENERGY_CONSUMPTION:
			v.NvmlReturn = uint32(f.energyRet)
			if f.energyRet == nvml.SUCCESS {
				v.ValueType = uint32(nvml.VALUE_TYPE_UNSIGNED_LONG_LONG)
				v.Timestamp = f.energyTS
				putU64(&v.Value, f.energyMJ)
			}
		default:
			v.NvmlReturn = uint32(nvml.ERROR_INVALID_ARGUMENT)
		}
	}
	return nvml.SUCCESS
}

func (f *fake) set(fn func(f *fake)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f)
}

// newServer returns a dgxa100 mock with n GPUs whose NVML calls are answered
// by the returned fakes.
func newServer(t *testing.T, n int) (*dgxa100.Server, []*fake) {
	t.Helper()
	s := dgxa100.New()
	s.DeviceGetCountFunc = func() (int, nvml.Return) { return n, nvml.SUCCESS }
	fakes := make([]*fake, n)
	for i := range n {
		f := &fake{
			powerMW: 250_000 + uint32(i)*1000, energyMJ: 1_000_000_000,
			powerTS: now.UnixMicro(), energyTS: now.UnixMicro() - 40_000,
			usageMW: 240_000, totalMJ: 2_000_000, memUsed: 10 << 30, util: 87, limitMW: 400_000,
		}
		fakes[i] = f
		d := s.Devices[i].(*dgxa100.Device)
		d.GetFieldValuesFunc = f.getFieldValues
		d.GetPowerUsageFunc = func() (uint32, nvml.Return) {
			f.mu.Lock()
			defer f.mu.Unlock()
			return f.usageMW, f.usageRet
		}
		d.GetTotalEnergyConsumptionFunc = func() (uint64, nvml.Return) {
			f.mu.Lock()
			defer f.mu.Unlock()
			return f.totalMJ, f.totalRet
		}
		d.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) {
			f.mu.Lock()
			defer f.mu.Unlock()
			total := d.MemoryInfo.Total
			return nvml.Memory{Total: total, Used: f.memUsed, Free: total - f.memUsed}, f.memRet
		}
		d.GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) {
			f.mu.Lock()
			defer f.mu.Unlock()
			return nvml.Utilization{Gpu: f.util, Memory: 30}, f.utilRet
		}
		d.GetEnforcedPowerLimitFunc = func() (uint32, nvml.Return) { return f.limitMW, nvml.SUCCESS }
		d.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
			return []nvml.ProcessInfo{{Pid: 100 + uint32(i), UsedGpuMemory: 3 << 30, GpuInstanceId: noInstance}, {Pid: 200, UsedGpuMemory: 1 << 30, GpuInstanceId: noInstance}}, nvml.SUCCESS
		}
		d.GetProcessUtilizationFunc = func(since uint64) ([]nvml.ProcessUtilizationSample, nvml.Return) {
			if i == 0 {
				return nil, nvml.ERROR_NOT_SUPPORTED
			}
			return []nvml.ProcessUtilizationSample{{Pid: 101, SmUtil: 60, TimeStamp: since + 1}, {Pid: 101, SmUtil: 80, TimeStamp: since + 2}, {Pid: 200, SmUtil: 10, TimeStamp: since + 1}}, nvml.SUCCESS
		}
	}
	return s, fakes
}

func newBackend(t *testing.T, s nvml.Interface) (*Backend, *bytes.Buffer) {
	t.Helper()
	var buf bytes.Buffer
	b, err := New(s, slog.New(slog.NewTextHandler(&buf, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b, &buf
}

func read(t *testing.T, b *Backend) []gpu.Sample {
	t.Helper()
	dst := make([]gpu.Sample, len(b.Devices()))
	if err := b.Read(now, dst); err != nil {
		t.Fatal(err)
	}
	return dst
}

func TestDevicesAndFields(t *testing.T) {
	s, fakes := newServer(t, 2)
	b, logs := newBackend(t, s)
	devs := b.Devices()
	if len(devs) != 2 {
		t.Fatalf("devices %+v", devs)
	}
	d := devs[1]
	if d.Index != 1 || d.UUID != s.Devices[1].(*dgxa100.Device).UUID || d.Name != "Mock NVIDIA A100-SXM4-40GB" ||
		d.MemTotalMiB != 40960 || d.PowerLimitW != 400 || !d.HasEnergyCounter || !d.HasInstantPower {
		t.Fatalf("device %+v", d)
	}
	if logs.Len() != 0 {
		t.Fatalf("unexpected logs: %s", logs)
	}

	fakes[0].set(func(f *fake) { f.fieldCalls, f.fieldCounts = 0, nil })
	smp := read(t, b)
	g := smp[0]
	if !g.PowerOK || g.PowerW != 250 || !g.PowerAt.Equal(now) {
		t.Fatalf("power %+v", g)
	}
	if !g.EnergyOK || g.EnergyJ != 1_000_000 || !g.EnergyAt.Equal(now.Add(-40*time.Millisecond)) {
		t.Fatalf("energy %+v", g)
	}
	if !g.MemOK || g.MemUsedMiB != 10240 || g.MemTotalMiB != 40960 || !g.UtilOK || g.UtilPct != 87 || g.Err != nil {
		t.Fatalf("mem/util %+v", g)
	}
	if !g.ReadAt.Equal(now) || g.Index != 0 || smp[1].Index != 1 || smp[1].PowerW != 251 {
		t.Fatalf("samples %+v", smp)
	}
	// exactly one GetFieldValues call with both fields, no fallback calls
	f := fakes[0]
	if f.fieldCalls != 1 || f.fieldCounts[0] != 2 {
		t.Fatalf("GetFieldValues calls %d %v", f.fieldCalls, f.fieldCounts)
	}
	md := s.Devices[0].(*dgxa100.Device)
	if len(md.GetPowerUsageCalls()) != 0 || len(md.GetTotalEnergyConsumptionCalls()) != 0 {
		t.Fatal("fallback calls made although fields are supported")
	}

	// the buffer is reused: same backing array on every call
	read(t, b)
	calls := md.GetFieldValuesCalls()
	a, c := calls[len(calls)-2].FieldValues, calls[len(calls)-1].FieldValues
	if &a[0] != &c[0] {
		t.Fatal("field value buffer not reused")
	}

	pids, err := b.ComputePIDs(1)
	if err != nil || len(pids) != 2 || pids[0] != 101 || pids[1] != 200 {
		t.Fatalf("ComputePIDs = %v, %v", pids, err)
	}
	if _, err := b.ComputePIDs(2); err == nil {
		t.Fatal("ComputePIDs(2): want error")
	}

	// Per-process use: SM averaged over the samples, memory from the list.
	use, err := b.ProcessUsage(1, time.Unix(100, 0))
	if err != nil || len(use) != 2 || use[101] != (gpu.ProcessUse{SMPct: 70, SMOK: true, MemMiB: 3072, MemOK: true}) ||
		use[200] != (gpu.ProcessUse{SMPct: 10, SMOK: true, MemMiB: 1024, MemOK: true}) {
		t.Fatalf("ProcessUsage(1) = %+v, %v", use, err)
	}
	if calls := md1(s).GetProcessUtilizationCalls(); len(calls) != 1 || calls[0].V != 100_000_000 {
		t.Fatalf("GetProcessUtilization calls %+v", calls)
	}
	// Without per-process utilisation: memory only.
	use, err = b.ProcessUsage(0, time.Time{})
	if err != nil || use[100].SMOK || !use[100].MemOK {
		t.Fatalf("ProcessUsage(0) = %+v, %v", use, err)
	}
}

// Processes in MIG instances carry their instance's compute slices.
func TestProcessUsageOnMIG(t *testing.T) {
	s, _ := newServer(t, 1)
	d := s.Devices[0].(*dgxa100.Device)
	d.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
		return []nvml.ProcessInfo{{Pid: 1, GpuInstanceId: 7}, {Pid: 2, GpuInstanceId: 9}, {Pid: 3, GpuInstanceId: noInstance}}, nvml.SUCCESS
	}
	d.GetProcessUtilizationFunc = func(uint64) ([]nvml.ProcessUtilizationSample, nvml.Return) { return nil, nvml.ERROR_NOT_SUPPORTED }
	profiles := map[uint32]uint32{7: 19, 9: 14} // instance -> profile id
	d.GetGpuInstanceByIdFunc = func(id int) (nvml.GpuInstance, nvml.Return) {
		p, ok := profiles[uint32(id)]
		if !ok {
			return nil, nvml.ERROR_NOT_FOUND
		}
		return &mock.GpuInstance{GetInfoFunc: func() (nvml.GpuInstanceInfo, nvml.Return) {
			return nvml.GpuInstanceInfo{Id: uint32(id), ProfileId: p}, nvml.SUCCESS
		}}, nvml.SUCCESS
	}
	d.GetGpuInstanceProfileInfoFunc = func(p int) (nvml.GpuInstanceProfileInfo, nvml.Return) {
		switch p {
		case nvml.GPU_INSTANCE_PROFILE_1_SLICE:
			return nvml.GpuInstanceProfileInfo{Id: 19, SliceCount: 1}, nvml.SUCCESS
		case nvml.GPU_INSTANCE_PROFILE_3_SLICE:
			return nvml.GpuInstanceProfileInfo{Id: 14, SliceCount: 3}, nvml.SUCCESS
		}
		return nvml.GpuInstanceProfileInfo{}, nvml.ERROR_NOT_SUPPORTED
	}
	b, err := New(s, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	use, err := b.ProcessUsage(0, time.Time{})
	if err != nil || use[1].MIGSlices != 1 || use[1].MIGInstance != 7 || use[2].MIGSlices != 3 || use[3].MIGSlices != 0 {
		t.Fatalf("ProcessUsage = %+v, %v", use, err)
	}
}

// Processes on MIG devices are found under their MIG device's UUID (GPU
// and compute instance ids), two compute instances of one GPU instance
// apart; the UUIDs are read again once a process is on an instance the
// last call did not see (destroyed and created anew: a new UUID).
func TestComputeMIGs(t *testing.T) {
	s, _ := newServer(t, 1)
	d := s.Devices[0].(*dgxa100.Device)
	var procs []nvml.ProcessInfo
	d.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) { return procs, nvml.SUCCESS }
	type mig struct {
		gi, ci int
		uuid   string
	}
	slots := []*mig{{1, 0, "MIG-a"}, nil, {2, 0, "MIG-b0"}, {2, 1, "MIG-b1"}} // nil: an empty slot
	reads := 0
	d.GetMaxMigDeviceCountFunc = func() (int, nvml.Return) { reads++; return len(slots), nvml.SUCCESS }
	d.GetMigDeviceHandleByIndexFunc = func(i int) (nvml.Device, nvml.Return) {
		m := slots[i]
		if m == nil {
			return nil, nvml.ERROR_NOT_FOUND
		}
		return &mock.Device{
			GetGpuInstanceIdFunc:     func() (int, nvml.Return) { return m.gi, nvml.SUCCESS },
			GetComputeInstanceIdFunc: func() (int, nvml.Return) { return m.ci, nvml.SUCCESS },
			GetUUIDFunc:              func() (string, nvml.Return) { return m.uuid, nvml.SUCCESS },
		}, nvml.SUCCESS
	}
	b, err := New(s, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	check := func(step string, want map[uint32]string, wantReads int) {
		t.Helper()
		got, err := b.ComputeMIGs(0)
		if err != nil || len(got) != len(want) {
			t.Fatalf("%s: ComputeMIGs = %v, %v; want %v", step, got, err, want)
		}
		for pid, u := range want {
			if got[pid] != u {
				t.Fatalf("%s: ComputeMIGs = %v; want %v", step, got, want)
			}
		}
		if reads != wantReads {
			t.Fatalf("%s: MIG devices read %d times, want %d", step, reads, wantReads)
		}
	}

	// Outside MIG: nothing to read.
	procs = []nvml.ProcessInfo{{Pid: 9, GpuInstanceId: noInstance, ComputeInstanceId: noInstance}}
	check("no MIG", map[uint32]string{}, 0)

	procs = []nvml.ProcessInfo{
		{Pid: 10, GpuInstanceId: 1, ComputeInstanceId: 0},
		{Pid: 11, GpuInstanceId: 2, ComputeInstanceId: 0},
		{Pid: 12, GpuInstanceId: 2, ComputeInstanceId: 1},
		{Pid: 13, GpuInstanceId: 2, ComputeInstanceId: 1},
		{Pid: 14, GpuInstanceId: 5, ComputeInstanceId: 0}, // no such MIG device
	}
	check("three MIG devices", map[uint32]string{10: "MIG-a", 11: "MIG-b0", 12: "MIG-b1", 13: "MIG-b1"}, 1)
	procs = procs[:4]
	check("cached", map[uint32]string{10: "MIG-a", 11: "MIG-b0", 12: "MIG-b1", 13: "MIG-b1"}, 1)

	// Instance 1 emptied, destroyed and created anew: a new UUID.
	procs = procs[1:]
	check("instance 1 empty", map[uint32]string{11: "MIG-b0", 12: "MIG-b1", 13: "MIG-b1"}, 1)
	slots[0] = &mig{1, 0, "MIG-a2"}
	procs = append(procs, nvml.ProcessInfo{Pid: 20, GpuInstanceId: 1, ComputeInstanceId: 0})
	check("instance 1 anew", map[uint32]string{11: "MIG-b0", 12: "MIG-b1", 13: "MIG-b1", 20: "MIG-a2"}, 2)

	if _, err := b.ComputeMIGs(3); err == nil {
		t.Fatal("ComputeMIGs(3) on a one-GPU server: no error")
	}
}

func md1(s *dgxa100.Server) *dgxa100.Device { return s.Devices[1].(*dgxa100.Device) }

func TestUnitConversion(t *testing.T) {
	s, fakes := newServer(t, 1)
	b, _ := newBackend(t, s)
	fakes[0].set(func(f *fake) {
		f.powerMW = 699_999               // mW
		f.energyMJ = 123_456_789_012_345  // mJ
		f.memUsed = 81559*mib + mib/2     // bytes
		f.powerTS = 1_700_000_000_123_456 // µs
	})
	g := read(t, b)[0]
	if math.Abs(g.PowerW-699.999) > 1e-9 || math.Abs(g.EnergyJ-123_456_789_012.345) > 1e-3 ||
		g.MemUsedMiB != 81559.5 {
		t.Fatalf("%+v", g)
	}
	if want := time.Unix(1_700_000_000, 123_456_000); !g.PowerAt.Equal(want) {
		t.Fatalf("PowerAt %v, want %v", g.PowerAt, want)
	}

	// every value type NVML may use decodes
	cases := []struct {
		vt   nvml.ValueType
		put  func(*[8]byte)
		want float64
	}{
		{nvml.VALUE_TYPE_DOUBLE, func(v *[8]byte) { putU64(v, math.Float64bits(1.5)) }, 1.5},
		{nvml.VALUE_TYPE_UNSIGNED_INT, func(v *[8]byte) { putU32(v, 4_000_000_000) }, 4e9},
		{nvml.VALUE_TYPE_UNSIGNED_LONG, func(v *[8]byte) { putU64(v, 1<<40) }, 1 << 40},
		{nvml.VALUE_TYPE_UNSIGNED_LONG_LONG, func(v *[8]byte) { putU64(v, 1<<50) }, 1 << 50},
		{nvml.VALUE_TYPE_SIGNED_LONG_LONG, func(v *[8]byte) { putU64(v, uint64(1<<63)) }, -(1 << 63)},
		{nvml.VALUE_TYPE_SIGNED_INT, func(v *[8]byte) { putU32(v, math.MaxUint32) }, -1},
		{nvml.VALUE_TYPE_UNSIGNED_SHORT, func(v *[8]byte) { binary.NativeEndian.PutUint16(v[:], 65535) }, 65535},
	}
	for _, c := range cases {
		f := nvml.FieldValue{ValueType: uint32(c.vt)}
		c.put(&f.Value)
		if got, ok := fieldValue(&f); !ok || got != c.want {
			t.Errorf("value type %d: got %v %v, want %v", c.vt, got, ok, c.want)
		}
	}
	if _, ok := fieldValue(&nvml.FieldValue{ValueType: uint32(nvml.VALUE_TYPE_COUNT)}); ok {
		t.Error("unknown value type decoded")
	}
	if !fieldTime(&nvml.FieldValue{}).IsZero() {
		t.Error("zero timestamp should give zero time")
	}
}

func TestNoEnergyField(t *testing.T) {
	// GPU 0: field 83 unsupported but GetTotalEnergyConsumption works.
	// GPU 1: neither works: no counter at all.
	s, fakes := newServer(t, 2)
	fakes[0].energyRet = nvml.ERROR_NOT_SUPPORTED
	fakes[1].energyRet = nvml.ERROR_NOT_SUPPORTED
	fakes[1].totalRet = nvml.ERROR_NOT_SUPPORTED
	b, logs := newBackend(t, s)
	devs := b.Devices()
	if !devs[0].HasEnergyCounter || devs[1].HasEnergyCounter || !devs[0].HasInstantPower || !devs[1].HasInstantPower {
		t.Fatalf("devices %+v", devs)
	}
	l := logs.String()
	if !strings.Contains(l, "level=WARN") || !strings.Contains(l, "falling back to GetTotalEnergyConsumption") ||
		!strings.Contains(l, "gpu=0") || !strings.Contains(l, "no energy counter") || !strings.Contains(l, "gpu=1") ||
		!strings.Contains(l, devs[1].UUID) {
		t.Fatalf("logs:\n%s", l)
	}
	fakes[0].set(func(f *fake) { f.fieldCounts = nil })
	fakes[1].set(func(f *fake) { f.fieldCounts = nil })
	g := read(t, b)
	if !g[0].EnergyOK || g[0].EnergyJ != 2000 || !g[0].EnergyAt.IsZero() || !g[0].PowerOK || g[0].Err != nil {
		t.Fatalf("gpu0 %+v", g[0])
	}
	if g[1].EnergyOK || g[1].EnergyJ != 0 || !g[1].PowerOK || g[1].Err != nil {
		t.Fatalf("gpu1 %+v", g[1])
	}
	// only the power field is requested now
	if fakes[0].fieldCounts[0] != 1 || fakes[1].fieldCounts[0] != 1 {
		t.Fatalf("field counts %v %v", fakes[0].fieldCounts, fakes[1].fieldCounts)
	}
}

func TestNoInstantPower(t *testing.T) {
	s, fakes := newServer(t, 2)
	fakes[0].powerRet = nvml.ERROR_NOT_SUPPORTED
	// GPU 1: an old driver without field values at all
	fakes[1].callRet = nvml.ERROR_NOT_SUPPORTED
	b, logs := newBackend(t, s)
	devs := b.Devices()
	if devs[0].HasInstantPower || !devs[0].HasEnergyCounter || devs[1].HasInstantPower || !devs[1].HasEnergyCounter {
		t.Fatalf("devices %+v", devs)
	}
	if l := logs.String(); !strings.Contains(l, "falling back to GetPowerUsage") || !strings.Contains(l, "gpu=0") ||
		!strings.Contains(l, "ERROR_NOT_SUPPORTED") {
		t.Fatalf("logs:\n%s", l)
	}
	fakes[1].set(func(f *fake) { f.fieldCalls = 0 })
	g := read(t, b)
	if !g[0].PowerOK || g[0].PowerW != 240 || !g[0].PowerAt.IsZero() || !g[0].EnergyOK || g[0].EnergyJ != 1e6 || g[0].Err != nil {
		t.Fatalf("gpu0 %+v", g[0])
	}
	if !g[1].PowerOK || g[1].PowerW != 240 || !g[1].EnergyOK || g[1].EnergyJ != 2000 || g[1].Err != nil {
		t.Fatalf("gpu1 %+v", g[1])
	}
	if fakes[1].fieldCalls != 0 {
		t.Fatal("GetFieldValues called for a GPU without supported fields")
	}
}

func TestCounterResetPassedThrough(t *testing.T) {
	s, fakes := newServer(t, 1)
	b, _ := newBackend(t, s)
	g := read(t, b)[0]
	if g.EnergyJ != 1e6 {
		t.Fatalf("%+v", g)
	}
	fakes[0].set(func(f *fake) { f.energyMJ = 5_000; f.energyTS += 100_000 }) // driver reloaded
	g = read(t, b)[0]
	if !g.EnergyOK || g.EnergyJ != 5 || g.Err != nil {
		t.Fatalf("after reset %+v", g)
	}
}

func TestStaleTimestamps(t *testing.T) {
	s, fakes := newServer(t, 1)
	b, _ := newBackend(t, s)
	a := read(t, b)[0]
	c := read(t, b)[0] // the fake's timestamps did not move
	if !a.EnergyAt.Equal(c.EnergyAt) || !a.PowerAt.Equal(c.PowerAt) {
		t.Fatal("same driver timestamps should come through unchanged")
	}
	fakes[0].set(func(f *fake) { f.energyTS += 100_000 })
	c = read(t, b)[0]
	if c.EnergyAt.Sub(a.EnergyAt) != 100*time.Millisecond {
		t.Fatalf("EnergyAt moved by %v", c.EnergyAt.Sub(a.EnergyAt))
	}
}

func TestErrorsMidRun(t *testing.T) {
	s, fakes := newServer(t, 3)
	b, _ := newBackend(t, s)
	read(t, b)

	// tick 2: GPU 0's GetFieldValues fails, GPU 1 has a per-field error,
	// GPU 2 is lost.
	fakes[0].set(func(f *fake) { f.callRet = nvml.ERROR_UNKNOWN })
	fakes[1].set(func(f *fake) { f.energyRet = nvml.ERROR_TIMEOUT })
	fakes[2].set(func(f *fake) {
		f.callRet, f.memRet, f.utilRet = nvml.ERROR_GPU_IS_LOST, nvml.ERROR_GPU_IS_LOST, nvml.ERROR_GPU_IS_LOST
	})
	g := read(t, b)
	if g[0].PowerOK || g[0].EnergyOK || !g[0].MemOK || !g[0].UtilOK || !errors.Is(g[0].Err, nvml.ERROR_UNKNOWN) {
		t.Fatalf("gpu0 %+v", g[0])
	}
	if !g[1].PowerOK || g[1].EnergyOK || !g[1].MemOK || !errors.Is(g[1].Err, nvml.ERROR_TIMEOUT) ||
		!strings.Contains(g[1].Err.Error(), "gpu 1: energy field") {
		t.Fatalf("gpu1 %+v", g[1])
	}
	if g[2].PowerOK || g[2].EnergyOK || g[2].MemOK || g[2].UtilOK || !errors.Is(g[2].Err, nvml.ERROR_GPU_IS_LOST) {
		t.Fatalf("gpu2 %+v", g[2])
	}
	var re *ReadError
	if !errors.As(g[2].Err, &re) || re.GPU != 2 {
		t.Fatalf("err %v", g[2].Err)
	}

	// all GPUs down: Read itself fails
	for _, f := range fakes {
		f.set(func(f *fake) {
			f.callRet, f.memRet, f.utilRet = nvml.ERROR_GPU_IS_LOST, nvml.ERROR_GPU_IS_LOST, nvml.ERROR_GPU_IS_LOST
		})
	}
	dst := make([]gpu.Sample, 3)
	if err := b.Read(now, dst); err == nil || !errors.Is(err, nvml.ERROR_GPU_IS_LOST) {
		t.Fatalf("all lost: err = %v", err)
	}

	// tick 4: everything recovers
	for _, f := range fakes {
		f.set(func(f *fake) {
			f.callRet, f.memRet, f.utilRet, f.energyRet = nvml.SUCCESS, nvml.SUCCESS, nvml.SUCCESS, nvml.SUCCESS
		})
	}
	for i, g := range read(t, b) {
		if !g.PowerOK || !g.EnergyOK || !g.MemOK || !g.UtilOK || g.Err != nil {
			t.Fatalf("recovered gpu %d %+v", i, g)
		}
	}

	if err := b.Read(now, make([]gpu.Sample, 2)); err == nil {
		t.Fatal("short dst: want error")
	}
}

func TestInitErrors(t *testing.T) {
	s := dgxa100.New()
	s.InitFunc = func() nvml.Return { return nvml.ERROR_LIBRARY_NOT_FOUND }
	_, err := New(s, nil)
	if err == nil || !errors.Is(err, ErrNoNVML) || !strings.Contains(err.Error(), "NVML/driver not found") ||
		!strings.Contains(err.Error(), "--gpu sim") {
		t.Fatalf("err = %v", err)
	}

	s = dgxa100.New()
	s.InitFunc = func() nvml.Return { return nvml.ERROR_NO_PERMISSION }
	if _, err = New(s, nil); err == nil || errors.Is(err, ErrNoNVML) || !strings.Contains(err.Error(), "ERROR_NO_PERMISSION") {
		t.Fatalf("err = %v", err)
	}

	// a failure after Init shuts NVML down again
	s, _ = newServer(t, 0)
	shut := 0
	s.ShutdownFunc = func() nvml.Return { shut++; return nvml.SUCCESS }
	if _, err = New(s, nil); err == nil || !strings.Contains(err.Error(), "no GPUs") || shut != 1 {
		t.Fatalf("err = %v, shutdowns %d", err, shut)
	}
}

func TestClose(t *testing.T) {
	s, _ := newServer(t, 1)
	shut := 0
	s.ShutdownFunc = func() nvml.Return { shut++; return nvml.SUCCESS }
	b, err := New(s, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil || shut != 1 {
		t.Fatalf("Close = %v, shutdowns %d", err, shut)
	}
	if err := b.Close(); err != nil || shut != 1 {
		t.Fatalf("second Close = %v, shutdowns %d", err, shut)
	}
	if err := b.Read(now, make([]gpu.Sample, 1)); err == nil {
		t.Fatal("Read after Close: want error")
	}
}

// allocDev is a minimal nvml.Device (no mock call recording, which itself
// allocates) for the allocation test.
type allocDev struct {
	nvml.Device
}

func (allocDev) GetUUID() (string, nvml.Return) { return "GPU-alloc", nvml.SUCCESS }
func (allocDev) GetName() (string, nvml.Return) { return "alloc", nvml.SUCCESS }
func (allocDev) GetMemoryInfo() (nvml.Memory, nvml.Return) {
	return nvml.Memory{Total: 80 << 30, Used: 1 << 30}, nvml.SUCCESS
}
func (allocDev) GetEnforcedPowerLimit() (uint32, nvml.Return) { return 700_000, nvml.SUCCESS }
func (allocDev) GetUtilizationRates() (nvml.Utilization, nvml.Return) {
	return nvml.Utilization{Gpu: 50}, nvml.SUCCESS
}
func (allocDev) GetFieldValues(v []nvml.FieldValue) nvml.Return {
	for k := range v {
		v[k].NvmlReturn = uint32(nvml.SUCCESS)
		v[k].ValueType = uint32(nvml.VALUE_TYPE_UNSIGNED_LONG_LONG)
		v[k].Timestamp = 1_700_000_000_000_000
		putU64(&v[k].Value, 300_000)
	}
	return nvml.SUCCESS
}

func TestReadDoesNotAllocate(t *testing.T) {
	lib := &mock.Interface{
		InitFunc:                   func() nvml.Return { return nvml.SUCCESS },
		ShutdownFunc:               func() nvml.Return { return nvml.SUCCESS },
		DeviceGetCountFunc:         func() (int, nvml.Return) { return 4, nvml.SUCCESS },
		DeviceGetHandleByIndexFunc: func(int) (nvml.Device, nvml.Return) { return allocDev{}, nvml.SUCCESS },
	}
	b, err := New(lib, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	dst := make([]gpu.Sample, 4)
	allocs := testing.AllocsPerRun(100, func() {
		if err := b.Read(now, dst); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("Read allocates %v times", allocs)
	}
	if dst[3].PowerW != 300 || dst[3].EnergyJ != 300 || !dst[3].PowerOK {
		t.Fatalf("%+v", dst[3])
	}
}
