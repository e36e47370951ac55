// Package amdgpu is the AMD GPU backend: it reads what the kernel's amdgpu
// driver exposes in sysfs, without ROCm (hwmon power in µW, the versioned
// binary gpu_metrics table, VRAM, gpu_busy_percent, the card's identity),
// and the per-client DRM usage in /proc/PID/fdinfo for process attribution.
//
// Energy is the counter (gpu_metrics' energy_accumulator, or AMD SMI's)
// where there is one, else the integral of power. Some firmware fills the
// accumulator wrongly, so the counter is checked against the power integral
// over its first CheckSpan; one that disagrees is dropped for the backend's
// life (docs/measurement.md, "AMD GPUs"). Every path is under
// Options.SysfsRoot / ProcfsRoot, so tests point it at fixture trees.
package amdgpu

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/trainmeter/trainmeter/pkg/gpu"

	"github.com/trainmeter/trainmeter/pkg/clock"
)

// Defaults of Options.
const (
	// DefaultCheckSpan is how long the counter is compared with power
	// before it is trusted: a few of the SMU's 1 s power averages.
	DefaultCheckSpan = 3 * time.Second
	// CheckTolerance is the share of the power integral by which the
	// counter may differ and still be trusted. A counter in the wrong unit
	// or stuck is off by far more; lag of a 1 s power average is less.
	CheckTolerance = 0.5
	// CheckFloorJ keeps the check from judging an idle card on noise.
	CheckFloorJ = 10.0
	// maxPlausibleW bounds a wrap's implied power: above it a decrease of
	// the accumulator is a reset (GPU reset, driver reload), not a wrap.
	maxPlausibleW = 5000.0
)

// Options configure New. The zero value reads the real /sys and /proc.
type Options struct {
	SysfsRoot  string // default /sys
	ProcfsRoot string // default /proc
	Logger     *slog.Logger
	CheckSpan  time.Duration // default DefaultCheckSpan
	Clock      clock.Clock   // of the per-process usage rates; default the wall clock
	// SMI, when set, is AMD SMI (package amdsmi): a card it gives a counter
	// for takes its energy from it instead of from gpu_metrics.
	SMI CounterSource
}

// CounterSource is an energy counter from outside sysfs, per card by PCI
// address: AMD SMI's amdsmi_get_energy_count.
type CounterSource interface {
	EnergyCount(pci string) (raw uint64, joulesPerCount float64, ok bool)
	Path() string
}

// CheckState is the outcome of the counter's check against power.
type CheckState string

// Check states.
const (
	CheckNoCounter CheckState = "no counter" // the card has no usable accumulator
	CheckPending   CheckState = "pending"    // still within CheckSpan
	CheckAgreed    CheckState = "agreed"     // counter trusted
	CheckNoPower   CheckState = "no power"   // nothing to check against; counter trusted
	CheckDisagreed CheckState = "disagreed"  // counter dropped, energy from power
)

// CounterCheck is a card's counter check: the counter's and the power
// integral's energy over the span that decided it.
type CounterCheck struct {
	State       CheckState
	CounterJ    float64
	IntegratedJ float64
	Span        time.Duration
}

// Sources says where a card's figures come from, for doctor and the log.
type Sources struct {
	Card string // card0
	PCI  string
	// Power is the file power comes from: "hwmon power1_input" (instant),
	// "hwmon power1_average", "gpu_metrics" (socket power), or "".
	Power        string
	PowerError   string
	Metrics      string // the gpu_metrics version ("1.5"), "" when unreadable
	MetricsError string
	// Counter: the card has an energy counter: AMD SMI's, or gpu_metrics'
	// accumulator where the firmware fills it. CounterSource names it:
	// "amd-smi PATH" or "gpu_metrics".
	Counter       bool
	CounterSource string
	Check         CounterCheck
	FdinfoError   string // why per-process usage cannot be read, if it cannot
}

type powerFile uint8

const (
	powerNone powerFile = iota
	powerInput
	powerAverage
	powerMetrics
)

type device struct {
	card           Card
	power          powerFile
	metricsOK      bool // gpu_metrics parsed
	metricsPending bool // gpu_metrics exists but could not be read yet
	counter        bool // there is an energy counter
	smi            bool // the counter is AMD SMI's
	src            Sources
	vramTotalMiB   float64 // read once: the board's VRAM does not change
	// The files read at every tick (powerPath: the hwmon file of
	// powerInput or powerAverage, else "").
	metricsPath, powerPath, vramUsedPath, busyPath string

	// The accumulator's wrap state: wrapAdd is added to raw values.
	prevRaw uint64
	prevAt  time.Time
	prevOK  bool
	wrapAdd uint64

	chk checker

	clients map[string]clientSeen
}

// Backend reads AMD GPUs from sysfs. It implements gpu.Backend,
// gpu.ProcessLister and gpu.ProcessUsageReader and is safe for concurrent
// use.
type Backend struct {
	opt  Options
	log  *slog.Logger
	devs []gpu.Device

	mu     sync.Mutex
	gpus   []*device
	closed bool

	// pmu guards the per-process state (fdinfo.go), apart from mu so that
	// a slow procfs scan never delays a sampling Read.
	pmu    sync.Mutex
	scan   []drmClient
	scanAt time.Time
}

// ErrNoAMD is wrapped by New's error when no amdgpu card is found.
var ErrNoAMD = errors.New("no AMD GPU found")

// New finds the amdgpu cards under opt.SysfsRoot and what each exposes.
func New(opt Options) (*Backend, error) {
	opt.SysfsRoot, opt.ProcfsRoot = cmp.Or(opt.SysfsRoot, "/sys"), cmp.Or(opt.ProcfsRoot, "/proc")
	if opt.CheckSpan <= 0 {
		opt.CheckSpan = DefaultCheckSpan
	}
	opt.Clock = cmp.Or(opt.Clock, clock.Clock(clock.Real{}))
	opt.Logger = cmp.Or(opt.Logger, slog.New(slog.DiscardHandler))
	cards, err := FindCards(opt.SysfsRoot)
	if err != nil && !os.IsNotExist(err) {
		return nil, fmt.Errorf("amdgpu: %w", err)
	}
	if len(cards) == 0 {
		return nil, fmt.Errorf("%w: no card with PCI vendor 0x1002 under %s (is the amdgpu driver loaded?); to run without a GPU use --gpu sim:2",
			ErrNoAMD, filepath.Join(opt.SysfsRoot, "class", "drm"))
	}
	b := &Backend{opt: opt, log: opt.Logger}
	for i, c := range cards {
		d, dev := b.probe(i, c)
		b.devs = append(b.devs, d)
		b.gpus = append(b.gpus, dev)
	}
	return b, nil
}

func (b *Backend) probe(i int, c Card) (gpu.Device, *device) {
	dev := &device{card: c, src: Sources{Card: c.Name, PCI: c.PCI},
		metricsPath:  filepath.Join(c.Dir, "gpu_metrics"),
		vramUsedPath: filepath.Join(c.Dir, "mem_info_vram_used"),
		busyPath:     filepath.Join(c.Dir, "gpu_busy_percent"),
		chk:          checker{span: b.opt.CheckSpan, state: CheckNoCounter}}
	d := gpu.Device{Index: i, Vendor: "amd", Name: cardName(c), UUID: cardUUID(c)}
	if v, err := readUint(filepath.Join(c.Dir, "mem_info_vram_total")); err == nil {
		d.MemTotalMiB = v >> 20
		dev.vramTotalMiB = float64(v) / (1 << 20)
	}
	if c.Hwmon != "" {
		if v, err := readUint(filepath.Join(c.Hwmon, "power1_cap")); err == nil {
			d.PowerLimitW = float64(v) / 1e6
		}
		// By presence, not by a first read: a card in runtime suspend or
		// reset answers EPERM, and must not lose its power file for good.
		for _, p := range []struct {
			f    powerFile
			name string
		}{{powerInput, "power1_input"}, {powerAverage, "power1_average"}} {
			path := filepath.Join(c.Hwmon, p.name)
			if _, err := os.Stat(path); err == nil {
				dev.power, dev.powerPath, dev.src.Power = p.f, path, "hwmon "+p.name
				break
			}
		}
	} else {
		dev.src.PowerError = "no hwmon directory with power1_input or power1_average under " + filepath.Join(c.Dir, "hwmon")
	}
	if b.opt.SMI != nil {
		if _, _, ok := b.opt.SMI.EnergyCount(c.PCI); ok {
			dev.smi = true
			dev.setCounter("amd-smi " + b.opt.SMI.Path())
		}
	}
	if raw, err := os.ReadFile(dev.metricsPath); err != nil {
		dev.src.MetricsError = err.Error()
		// Present but unreadable now (runtime suspend, reset): what the
		// table holds is found at the first read that succeeds.
		dev.metricsPending = !os.IsNotExist(err)
	} else if m, err := ParseMetrics(raw); err != nil {
		dev.src.MetricsError = err.Error()
	} else {
		dev.useMetrics(m)
	}
	if dev.src.Power == "" {
		dev.src.PowerError = cmp.Or(dev.src.PowerError, "no power1_input or power1_average in "+c.Hwmon)
	}
	d.HasEnergyCounter = dev.counter
	d.HasInstantPower = dev.power == powerInput
	b.log.Info("amdgpu: card", "gpu", i, "card", c.Name, "pci", c.PCI, "name", d.Name,
		"power", dev.src.Power, "gpu_metrics", dev.src.Metrics, "energy_counter", dev.src.CounterSource)
	if dev.power == powerNone && !dev.counter {
		b.log.Warn("amdgpu: card reports neither power nor an energy counter; its energy will be zero",
			"gpu", i, "card", c.Name, "power_err", dev.src.PowerError, "gpu_metrics_err", dev.src.MetricsError)
	}
	return d, dev
}

// useMetrics takes what the card's gpu_metrics table offers: its energy
// accumulator where filled (unless AMD SMI gives the counter), and its
// socket power where hwmon has none.
func (d *device) useMetrics(m Metrics) {
	d.metricsOK, d.metricsPending = true, false
	d.src.Metrics, d.src.MetricsError = m.Version(), ""
	if !d.smi && m.EnergyOK {
		d.setCounter("gpu_metrics")
	}
	if d.power == powerNone && m.PowerOK {
		d.power, d.src.Power, d.src.PowerError = powerMetrics, "gpu_metrics", ""
	}
}

// setCounter records that the card has an energy counter, from source; the
// counter is then checked against power.
func (d *device) setCounter(source string) {
	d.counter, d.src.Counter, d.src.CounterSource = true, true, source
	if d.chk.state == CheckNoCounter {
		d.chk.state = CheckPending
	}
}

func cardName(c Card) string {
	if s, err := readString(filepath.Join(c.Dir, "product_name")); err == nil && s != "" {
		return s
	}
	if s, ok := knownNames[c.DeviceID]; ok {
		return s
	}
	return fmt.Sprintf("AMD GPU [1002:%04x]", c.DeviceID)
}

// cardUUID is the card's stable id: the firmware's unique_id where the
// board has one (Instinct), else its PCI address.
func cardUUID(c Card) string {
	if s, err := readString(filepath.Join(c.Dir, "unique_id")); err == nil && s != "" {
		return "AMD-" + s
	}
	return "AMD-PCI-" + c.PCI
}

// Devices implements gpu.Backend.
func (b *Backend) Devices() []gpu.Device { return slices.Clone(b.devs) }

// Sources says where card index's figures come from and how its counter
// check stands.
func (b *Backend) Sources(index int) Sources {
	b.mu.Lock()
	defer b.mu.Unlock()
	if index < 0 || index >= len(b.gpus) {
		return Sources{}
	}
	s := b.gpus[index].src
	s.Check = b.gpus[index].chk.result()
	return s
}

// Read implements gpu.Backend. Per-card failures go in Sample.Err; the
// error is returned only when no card gave any value.
func (b *Backend) Read(now time.Time, dst []gpu.Sample) error {
	if len(dst) != len(b.gpus) {
		return fmt.Errorf("amdgpu: Read: len(dst) = %d, want %d", len(dst), len(b.gpus))
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return errors.New("amdgpu: Read after Close")
	}
	return gpu.ReadEach("amdgpu", now, dst, func(i int, s *gpu.Sample) { b.read(i, b.gpus[i], now, s) })
}

func (b *Backend) read(i int, d *device, now time.Time, s *gpu.Sample) {
	fail := func(err error) {
		if s.Err == nil {
			s.Err = fmt.Errorf("amdgpu: gpu %d (%s): %w", i, d.card.Name, err)
		}
	}
	var m Metrics
	metricsOK := false
	if d.metricsPending {
		if raw, err := os.ReadFile(d.metricsPath); err == nil {
			if pm, err := ParseMetrics(raw); err == nil {
				d.useMetrics(pm)
				m, metricsOK = pm, true
				b.log.Info("amdgpu: gpu_metrics readable now", "gpu", i, "card", d.card.Name, "version", pm.Version(), "energy_counter", d.src.CounterSource)
			} else {
				d.metricsPending, d.src.MetricsError = false, err.Error()
			}
		}
	} else if d.metricsOK {
		if raw, err := os.ReadFile(d.metricsPath); err != nil {
			fail(err)
		} else if m, err = ParseMetrics(raw); err != nil {
			fail(err)
		} else {
			metricsOK = true
		}
	}
	switch d.power {
	case powerInput, powerAverage:
		if uw, err := readUint(d.powerPath); err != nil {
			fail(err)
		} else {
			s.PowerW, s.PowerOK = float64(uw)/1e6, true
		}
	case powerMetrics:
		if metricsOK && m.PowerOK {
			s.PowerW, s.PowerOK = m.PowerW, true
		}
	}
	if d.counter && d.chk.state != CheckDisagreed && d.smi {
		if raw, unit, ok := b.opt.SMI.EnergyCount(d.card.PCI); ok {
			s.EnergyJ, s.EnergyOK = d.extend(raw, unit, now), true
		} else {
			fail(errors.New("amd-smi: amdsmi_get_energy_count failed"))
		}
	} else if d.counter && d.chk.state != CheckDisagreed && metricsOK && m.EnergyOK {
		s.EnergyJ, s.EnergyOK = d.extend(m.EnergyRaw, EnergyUnitJ, now), true
		// No EnergyAt: system_clock_counter is stamped by the driver at
		// each read of the file, not by the firmware when it measured, so
		// it is no better than the read time.
	}
	if d.counter {
		prev := d.chk.state
		d.chk.observe(now, s)
		if st := d.chk.state; st != prev {
			r := d.chk.result()
			switch st {
			case CheckAgreed, CheckNoPower:
				b.log.Info("amdgpu: energy counter checked against power", "gpu", i, "card", d.card.Name, "result", string(st),
					"counter_j", r.CounterJ, "integrated_j", r.IntegratedJ, "span", r.Span)
			default:
				b.log.Warn("amdgpu: energy counter disagrees with power; energy is integrated from power from now on",
					"gpu", i, "card", d.card.Name, "result", string(st), "counter_j", r.CounterJ, "integrated_j", r.IntegratedJ, "span", r.Span)
				s.EnergyOK = false
			}
		}
	}
	if v, err := readUint(d.vramUsedPath); err == nil {
		s.MemUsedMiB, s.MemTotalMiB, s.MemOK = float64(v)/(1<<20), d.vramTotalMiB, true
	} else if !os.IsNotExist(err) {
		fail(err)
	}
	if v, err := readUint(d.busyPath); err == nil && v <= 100 {
		s.UtilPct, s.UtilOK = float64(v), true
	} else if metricsOK && m.GfxBusyOK {
		s.UtilPct, s.UtilOK = m.GfxBusyPct, true
	}
}

// extend turns the raw accumulator into a counter that survives a 32-bit
// wrap (a v1.0 table, or a 32-bit PMFW value in the 64-bit field: every
// 65536 J, about 90 s at 700 W). A decrease is a wrap when the energy it
// implies is plausible for the time since the previous read; otherwise it
// is a reset, passed on for the energy curve to bridge with power.
func (d *device) extend(raw uint64, unitJ float64, now time.Time) float64 {
	if d.prevOK && raw < d.prevRaw && d.prevRaw < 1<<32 {
		dt := now.Sub(d.prevAt).Seconds()
		wrapped := float64((1<<32)-d.prevRaw+raw) * unitJ
		if dt > 0 && wrapped <= maxPlausibleW*dt {
			d.wrapAdd += 1 << 32
		}
	}
	d.prevRaw, d.prevAt, d.prevOK = raw, now, true
	return float64(d.wrapAdd+raw) * unitJ
}

// checker compares the counter with the power integral over the first
// span of reads.
type checker struct {
	span  time.Duration
	state CheckState

	started   bool
	startAt   time.Time
	startJ    float64
	lastJ     float64
	lastPower time.Time
	lastW     float64
	hasPower  bool
	intJ      float64
	at        time.Time
}

func (c *checker) observe(now time.Time, s *gpu.Sample) {
	if c.state != CheckPending || (!c.started && !s.EnergyOK) {
		return
	}
	if c.started && s.EnergyOK && s.EnergyJ < c.lastJ {
		// A reset (GPU reset, driver reload) within the span: the check
		// starts over from it.
		*c = checker{span: c.span, state: CheckPending}
	}
	if !c.started {
		c.started, c.startAt, c.startJ = true, now, s.EnergyJ
	}
	if s.PowerOK {
		if c.hasPower {
			c.intJ += (c.lastW + s.PowerW) / 2 * now.Sub(c.lastPower).Seconds()
		}
		c.lastPower, c.lastW, c.hasPower = now, s.PowerW, true
	}
	if s.EnergyOK {
		c.lastJ = s.EnergyJ
	}
	if now.Sub(c.startAt) < c.span {
		return
	}
	c.at = now
	counter := c.lastJ - c.startJ
	switch {
	case !c.hasPower:
		c.state = CheckNoPower
	case CounterAgrees(counter, c.intJ):
		c.state = CheckAgreed
	default:
		c.state = CheckDisagreed
	}
}

func (c *checker) result() CounterCheck {
	r := CounterCheck{State: c.state, CounterJ: c.lastJ - c.startJ, IntegratedJ: c.intJ}
	// Up to the decision, or while pending up to the last power reading
	// (both zero before the start).
	if end := cmp.Or(c.at, c.lastPower); end.After(c.startAt) {
		r.Span = end.Sub(c.startAt)
	}
	return r
}

// CounterAgrees is the check's rule: the counter's energy is within
// CheckTolerance of the power integral, or within CheckFloorJ of it.
func CounterAgrees(counterJ, integratedJ float64) bool {
	return math.Abs(counterJ-integratedJ) <= math.Max(CheckTolerance*integratedJ, CheckFloorJ)
}

// Close implements gpu.Backend: further Reads fail, and Options.SMI is
// closed when it can be.
func (b *Backend) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil
	}
	b.closed = true
	if c, ok := b.opt.SMI.(io.Closer); ok {
		return c.Close()
	}
	return nil
}

// parseSize reads "1024 KiB" (the unit optional: bytes) as MiB.
func parseSize(v string) (float64, bool) {
	num, unit, _ := strings.Cut(strings.TrimSpace(v), " ")
	n, err := strconv.ParseUint(num, 10, 64)
	if err != nil {
		return 0, false
	}
	switch strings.TrimSpace(unit) {
	case "", "B":
		return float64(n) / (1 << 20), true
	case "KiB":
		return float64(n) / (1 << 10), true
	case "MiB":
		return float64(n), true
	case "GiB":
		return float64(n) * (1 << 10), true
	}
	return 0, false
}

var (
	_ gpu.Backend            = (*Backend)(nil)
	_ gpu.ProcessLister      = (*Backend)(nil)
	_ gpu.ProcessUsageReader = (*Backend)(nil)
)
