package amdgpu

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// Metrics is what this package uses from one read of an amdgpu card's
// gpu_metrics file: a binary table whose layout is versioned by its header
// (struct metrics_table_header in the kernel's
// drivers/gpu/drm/amd/include/kgd_pp_interface.h). The driver fills the
// table it does not know with 0xFF bytes (smu_cmn_init_soft_gpu_metrics), so
// an all-ones field means "not provided by this firmware".
type Metrics struct {
	StructureSize  uint16
	FormatRevision uint8
	// ContentRevision with FormatRevision names the layout: v1.3 is
	// RDNA2/RDNA3 and CDNA2 boards, v1.4/v1.5 the MI300 series, v3.0 the
	// Strix-class APUs (no energy accumulator).
	ContentRevision uint8

	// EnergyRaw is energy_accumulator in its units of 2^-16 J (15.259 µJ,
	// the unit the header states for v1.4+ and that amd-smi reports as the
	// counter resolution for every v1.x board); EnergyOK when the table
	// has the field and the firmware filled it.
	EnergyRaw uint64
	EnergyOK  bool
	// EnergyBits is the field's width: 32 in v1.0, 64 from v1.1.
	EnergyBits int

	// PowerW is the socket power the table states: average_socket_power
	// (W) in v1.0–v1.3, curr_socket_power (W) in v1.4/v1.5,
	// average_socket_power (mW) in v3.0.
	PowerW  float64
	PowerOK bool

	// GfxBusyPct is average_gfx_activity (%).
	GfxBusyPct float64
	GfxBusyOK  bool
}

// EnergyUnitJ is the unit of energy_accumulator: 2^-16 J.
const EnergyUnitJ = 1.0 / 65536

// Version is "format.content", as the kernel names the layouts.
func (m Metrics) Version() string {
	return fmt.Sprintf("%d.%d", m.FormatRevision, m.ContentRevision)
}

// layout is where the fields this package reads sit in one table version.
// Offsets follow the C structs' natural alignment (the v1.0 table is the
// only one the kernel calls "not naturally aligned", and it still is at
// the fields read here).
type layout struct {
	minSize     int // bytes up to the last field read or written (system_clock_counter)
	energyOff   int // -1: no energy_accumulator
	energyBits  int
	powerOff    int
	powerBits   int     // 16 or 32
	powerScale  float64 // W per unit
	gfxOff      int
	timestampAt int
}

var layouts = map[[2]uint8]layout{
	// gpu_metrics_v1_0: system_clock_counter right after the header.
	{1, 0}: {minSize: 40, energyOff: 36, energyBits: 32, powerOff: 34, powerBits: 16, powerScale: 1, gfxOff: 28, timestampAt: 8},
	// gpu_metrics_v1_1..v1_3 share the head of the table.
	{1, 1}: v1x, {1, 2}: v1x, {1, 3}: v1x,
	// gpu_metrics_v1_4 (MI300 series): curr_socket_power, vcn_activity[4].
	{1, 4}: {minSize: 40, energyOff: 24, energyBits: 64, powerOff: 10, powerBits: 16, powerScale: 1, gfxOff: 12, timestampAt: 32},
	// gpu_metrics_v1_5 (MI300 series, newer firmware): jpeg_activity[32]
	// moves the accumulator to 88.
	{1, 5}: {minSize: 104, energyOff: 88, energyBits: 64, powerOff: 10, powerBits: 16, powerScale: 1, gfxOff: 12, timestampAt: 96},
	// gpu_metrics_v3_0 (APUs): power in mW, no energy accumulator.
	{3, 0}: {minSize: 116, energyOff: -1, powerOff: 112, powerBits: 32, powerScale: 1e-3, gfxOff: 42, timestampAt: 104},
}

var v1x = layout{minSize: 40, energyOff: 24, energyBits: 64, powerOff: 22, powerBits: 16, powerScale: 1, gfxOff: 16, timestampAt: 32}

// ErrMetricsVersion is wrapped by ParseMetrics for a table version this
// package has no layout for; hwmon power still works for such a card.
var ErrMetricsVersion = errors.New("gpu_metrics version not known")

// ParseMetrics decodes a gpu_metrics table (little-endian, as every amdgpu
// host is). It never panics on short or garbled input.
func ParseMetrics(b []byte) (Metrics, error) {
	if len(b) < 4 {
		return Metrics{}, fmt.Errorf("gpu_metrics: %d bytes, shorter than its 4-byte header", len(b))
	}
	m := Metrics{
		StructureSize:   binary.LittleEndian.Uint16(b[0:2]),
		FormatRevision:  b[2],
		ContentRevision: b[3],
	}
	l, ok := layouts[[2]uint8{m.FormatRevision, m.ContentRevision}]
	if !ok {
		return m, fmt.Errorf("%w: v%s (known: 1.0–1.5, 3.0)", ErrMetricsVersion, m.Version())
	}
	if len(b) < l.minSize {
		return m, fmt.Errorf("gpu_metrics v%s: %d bytes, want at least %d", m.Version(), len(b), l.minSize)
	}
	if l.energyOff >= 0 {
		m.EnergyBits = l.energyBits
		m.EnergyRaw, m.EnergyOK = field(b, l.energyOff, l.energyBits)
	}
	p, ok := field(b, l.powerOff, l.powerBits)
	m.PowerW, m.PowerOK = float64(p)*l.powerScale, ok
	if v, ok := field(b, l.gfxOff, 16); ok && v <= 100 {
		m.GfxBusyPct, m.GfxBusyOK = float64(v), true
	}
	if !m.PowerOK {
		m.PowerW = 0
	}
	return m, nil
}

// MetricsSpec is the content of a gpu_metrics table to encode: the fields
// this package reads, everything else 0xFF as the driver leaves it. Tests
// and the fixture generator write tables with it.
type MetricsSpec struct {
	Format, Content uint8
	// EnergyRaw is written as is; EnergyUnset writes all ones instead (the
	// firmware does not fill the accumulator).
	EnergyRaw   uint64
	EnergyUnset bool
	// PowerW is written in the version's unit (W, or mW in v3.0).
	PowerW      float64
	GfxBusyPct  uint16
	TimestampNs uint64
}

// structSizes are sizeof(struct gpu_metrics_vX_Y) on x86-64 worked out
// from the kernel's structs: what the driver writes in structure_size and
// the length of the sysfs file. v3.0 is only its head up to
// average_socket_power, padded: its tail changed between kernels and
// nothing in it is read here.
var structSizes = map[[2]uint8]int{
	{1, 0}: 80, {1, 1}: 96, {1, 2}: 104, {1, 3}: 120,
	{1, 4}: 288, {1, 5}: 360, {3, 0}: 120,
}

// EncodeMetrics returns the table spec describes, as the kernel lays it out.
func EncodeMetrics(s MetricsSpec) ([]byte, error) {
	key := [2]uint8{s.Format, s.Content}
	l, ok := layouts[key]
	if !ok {
		return nil, fmt.Errorf("%w: v%d.%d", ErrMetricsVersion, s.Format, s.Content)
	}
	size := structSizes[key]
	b := bytes.Repeat([]byte{0xFF}, size)
	binary.LittleEndian.PutUint16(b[0:], uint16(size))
	b[2], b[3] = s.Format, s.Content
	if l.energyOff >= 0 {
		v := s.EnergyRaw
		if s.EnergyUnset {
			v = math.MaxUint64
		}
		putField(b, l.energyOff, l.energyBits, v)
	}
	putField(b, l.powerOff, l.powerBits, uint64(s.PowerW/l.powerScale+0.5))
	binary.LittleEndian.PutUint16(b[l.gfxOff:], s.GfxBusyPct)
	binary.LittleEndian.PutUint64(b[l.timestampAt:], s.TimestampNs)
	return b, nil
}

// field reads the little-endian unsigned field of width bits (16, 32 or
// 64) at off, and whether it is set: not all ones, the driver's fill.
func field(b []byte, off, bits int) (uint64, bool) {
	switch bits {
	case 16:
		v := binary.LittleEndian.Uint16(b[off:])
		return uint64(v), v != math.MaxUint16
	case 32:
		v := binary.LittleEndian.Uint32(b[off:])
		return uint64(v), v != math.MaxUint32
	}
	v := binary.LittleEndian.Uint64(b[off:])
	return v, v != math.MaxUint64
}

// putField writes v, cut to width bits, at off.
func putField(b []byte, off, bits int, v uint64) {
	switch bits {
	case 16:
		binary.LittleEndian.PutUint16(b[off:], uint16(v))
	case 32:
		binary.LittleEndian.PutUint32(b[off:], uint32(v))
	default:
		binary.LittleEndian.PutUint64(b[off:], v)
	}
}
