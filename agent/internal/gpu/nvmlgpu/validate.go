package nvmlgpu

import (
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/trainmeter/trainmeter/pkg/clock"
)

// ValidateOptions tunes Validate.
type ValidateOptions struct {
	// Duration of the passive observation; default 30 s.
	Duration time.Duration
	// Interval between reads, as the agent's sampling; default 50 ms.
	Interval time.Duration
	// Clock paces the reads; the wall clock if nil.
	Clock clock.Clock
}

// Verdicts, worst last.
const (
	VerdictPass = "pass"
	VerdictWarn = "warn"
	VerdictFail = "fail"
)

// ValidateReport is what `trainmeter-agent validate` found.
type ValidateReport struct {
	DurationS  float64       `json:"duration_s"`
	IntervalMs float64       `json:"interval_ms"`
	Driver     string        `json:"driver_version,omitempty"`
	GPUs       []GPUValidity `json:"gpus"`
	Verdict    string        `json:"verdict"`
}

// GPUValidity is one GPU's observation. Durations are in ms, energy in J,
// shares and disagreement in % (of the reads, of the counter energy).
type GPUValidity struct {
	Index int    `json:"index"`
	UUID  string `json:"uuid"`
	Name  string `json:"name"`
	// Fields supported: 186 instant power, 185 average power, 83 energy.
	InstantPower bool `json:"field_186_instant_power"`
	AveragePower bool `json:"field_185_average_power"`
	EnergyField  bool `json:"field_83_energy"`
	Reads        int  `json:"reads"`
	// Median time between successive distinct driver timestamps.
	PowerUpdateMs  float64 `json:"power_update_ms"`
	EnergyUpdateMs float64 `json:"energy_update_ms"`
	// Reads whose driver timestamp had not moved since the previous read.
	StalePowerPct  float64 `json:"stale_power_reads_pct"`
	StaleEnergyPct float64 `json:"stale_energy_reads_pct"`
	// Energy over the observation by the counter and by integrating field
	// 186's distinct readings, over the same interval.
	CounterJ        float64 `json:"counter_J"`
	IntegratedJ     float64 `json:"integrated_J"`
	DisagreementPct float64 `json:"counter_vs_integrated_pct"`
	// Cost of each NVML call the agent makes per tick, µs.
	CallCostUs map[string]CallCost `json:"call_cost_us"`
	ReadErrors map[string]int      `json:"read_errors,omitempty"`
	Verdict    string              `json:"verdict"`
	Reasons    []string            `json:"reasons"`
}

// CallCost is the wall time of one NVML call over the observation.
type CallCost struct {
	MeanUs float64 `json:"mean"`
	MaxUs  float64 `json:"max"`
	N      int     `json:"n"`
}

// Validate initialises NVML through lib (nil: nvml.New()), reads every GPU
// every Interval for Duration without generating any load, and judges the
// sensor: which fields answer, how often they update, how many reads are
// stale, whether the energy counter and the sampled power agree, and what
// each call costs. The error is set only when NVML cannot be used at all.
func Validate(lib nvml.Interface, o ValidateOptions) (ValidateReport, error) {
	if lib == nil {
		lib = nvml.New()
	}
	if o.Duration <= 0 {
		o.Duration = 30 * time.Second
	}
	if o.Interval <= 0 {
		o.Interval = 50 * time.Millisecond
	}
	if o.Clock == nil {
		o.Clock = clock.Real{}
	}
	rep := ValidateReport{DurationS: o.Duration.Seconds(), IntervalMs: float64(o.Interval) / float64(time.Millisecond)}
	if ret := initReturn(lib); ret != nvml.SUCCESS {
		return rep, fmt.Errorf("%w: %s", ErrNoNVML, explainInit(ret))
	}
	defer lib.Shutdown()
	rep.Driver, _ = call(lib.SystemGetDriverVersion)
	n, ret := call(lib.DeviceGetCount)
	if ret != nvml.SUCCESS {
		return rep, fmt.Errorf("nvml: cannot count GPUs: %v", ret)
	}
	if n == 0 {
		return rep, fmt.Errorf("nvml: no GPUs found")
	}
	obs := make([]*observer, n)
	for i := range n {
		g := GPUValidity{Index: i, CallCostUs: map[string]CallCost{}, ReadErrors: map[string]int{}}
		h, ret := lib.DeviceGetHandleByIndex(i)
		if ret == nvml.SUCCESS {
			g.UUID, _ = call(h.GetUUID)
			g.Name, _ = call(h.GetName)
		} else {
			g.ReadErrors["handle"]++
		}
		obs[i] = &observer{g: g, h: h}
	}
	start := o.Clock.Now()
	for next := start; o.Clock.Now().Sub(start) < o.Duration; {
		for _, ob := range obs {
			if ob.h != nil {
				ob.read()
			}
		}
		next = next.Add(o.Interval)
		if d := next.Sub(o.Clock.Now()); d > 0 {
			<-o.Clock.After(d)
		}
	}
	rep.Verdict = VerdictPass
	for _, ob := range obs {
		ob.judge()
		rep.GPUs = append(rep.GPUs, ob.g)
		rep.Verdict = worse(rep.Verdict, ob.g.Verdict)
	}
	return rep, nil
}

type point struct {
	at time.Time
	v  float64
}

type observer struct {
	g                                                GPUValidity
	h                                                nvml.Device
	power                                            []point // distinct field-186 readings
	energy                                           []point // distinct field-83 readings
	costs                                            map[string][]time.Duration
	stalePower, staleEnergy, powerReads, energyReads int
}

func (ob *observer) timed(name string, f func() nvml.Return) nvml.Return {
	t0 := time.Now()
	ret := safeReturn(f)
	if ob.costs == nil {
		ob.costs = map[string][]time.Duration{}
	}
	ob.costs[name] = append(ob.costs[name], time.Since(t0))
	if ret != nvml.SUCCESS && ret != nvml.ERROR_NOT_SUPPORTED {
		ob.g.ReadErrors[name+": "+ret.Error()]++
	}
	return ret
}

// read makes the agent's per-tick calls, timing each.
func (ob *observer) read() {
	ob.g.Reads++
	fv := []nvml.FieldValue{{FieldId: FieldPowerInstant}, {FieldId: FieldPowerAverage}, {FieldId: FieldTotalEnergy}}
	if ob.timed("GetFieldValues", func() nvml.Return { return ob.h.GetFieldValues(fv) }) == nvml.SUCCESS {
		ob.field(&fv[0], &ob.g.InstantPower, &ob.power, &ob.powerReads, &ob.stalePower)
		var avg []point
		var n, s int
		ob.field(&fv[1], &ob.g.AveragePower, &avg, &n, &s)
		ob.field(&fv[2], &ob.g.EnergyField, &ob.energy, &ob.energyReads, &ob.staleEnergy)
	}
	ob.timed("GetPowerUsage", func() nvml.Return { _, r := ob.h.GetPowerUsage(); return r })
	ob.timed("GetTotalEnergyConsumption", func() nvml.Return { _, r := ob.h.GetTotalEnergyConsumption(); return r })
	ob.timed("GetMemoryInfo", func() nvml.Return { _, r := ob.h.GetMemoryInfo(); return r })
	ob.timed("GetUtilizationRates", func() nvml.Return { _, r := ob.h.GetUtilizationRates(); return r })
}

func (ob *observer) field(f *nvml.FieldValue, supported *bool, pts *[]point, reads, stale *int) {
	if nvml.Return(f.NvmlReturn) != nvml.SUCCESS {
		return
	}
	v, ok := fieldValue(f)
	if !ok {
		return
	}
	*supported = true
	*reads++
	at := fieldTime(f)
	if n := len(*pts); n > 0 && !at.After((*pts)[n-1].at) {
		*stale++
		return
	}
	*pts = append(*pts, point{at, v / 1000})
}

func medianUpdateMs(pts []point) float64 {
	if len(pts) < 2 {
		return 0
	}
	d := make([]float64, len(pts)-1)
	for i := range d {
		d[i] = float64(pts[i+1].at.Sub(pts[i].at)) / float64(time.Millisecond)
	}
	slices.Sort(d)
	return d[len(d)/2]
}

func (ob *observer) judge() {
	g := &ob.g
	for name, ds := range ob.costs {
		c := CallCost{N: len(ds)}
		for _, d := range ds {
			us := float64(d) / float64(time.Microsecond)
			c.MeanUs += us
			c.MaxUs = math.Max(c.MaxUs, us)
		}
		c.MeanUs /= float64(len(ds))
		g.CallCostUs[name] = c
	}
	g.PowerUpdateMs, g.EnergyUpdateMs = medianUpdateMs(ob.power), medianUpdateMs(ob.energy)
	if ob.powerReads > 0 {
		g.StalePowerPct = 100 * float64(ob.stalePower) / float64(ob.powerReads)
	}
	if ob.energyReads > 0 {
		g.StaleEnergyPct = 100 * float64(ob.staleEnergy) / float64(ob.energyReads)
	}
	g.Verdict = VerdictPass
	add := func(v, why string) {
		g.Verdict = worse(g.Verdict, v)
		g.Reasons = append(g.Reasons, v+": "+why)
	}
	if len(ob.power) >= 2 && len(ob.energy) >= 2 {
		a, b := ob.energy[0], ob.energy[len(ob.energy)-1]
		g.CounterJ = b.v - a.v
		var integ float64
		for i := 1; i < len(ob.power); i++ {
			p, q := ob.power[i-1], ob.power[i]
			integ += (p.v + q.v) / 2 * q.at.Sub(p.at).Seconds()
		}
		span := ob.power[len(ob.power)-1].at.Sub(ob.power[0].at).Seconds()
		if span > 0 {
			g.IntegratedJ = integ / span * b.at.Sub(a.at).Seconds()
		}
		if g.CounterJ != 0 {
			g.DisagreementPct = 100 * (g.CounterJ - g.IntegratedJ) / g.CounterJ
		}
	}
	switch {
	case !g.EnergyField:
		add(VerdictWarn, "the energy counter field (83) is not supported: energy comes from the fallback call or from sampled power only")
	case len(ob.energy) < 2:
		add(VerdictFail, fmt.Sprintf("the energy counter's driver timestamp never advanced in %d reads: the counter is stuck, energy would be zero", ob.energyReads))
	case g.CounterJ <= 0:
		add(VerdictFail, fmt.Sprintf("the energy counter did not increase (%+.3f J) while its timestamp advanced: even an idle GPU draws tens of watts", g.CounterJ))
	case g.EnergyUpdateMs > 250:
		add(VerdictWarn, fmt.Sprintf("the energy counter updates every %.0f ms, slower than the 100 ms published for A100/H100: cuts at run start and end are coarser", g.EnergyUpdateMs))
	}
	switch {
	case !g.InstantPower:
		add(VerdictWarn, "the instant power field (186) is not supported: the agent falls back to GetPowerUsage, a 1 s average")
	case len(ob.power) < 2:
		add(VerdictFail, fmt.Sprintf("the instant power's driver timestamp never advanced in %d reads: the power reading is stuck", ob.powerReads))
	}
	if g.CounterJ > 0 && g.IntegratedJ > 0 && math.Abs(g.DisagreementPct) > 5 {
		add(VerdictWarn, fmt.Sprintf("the counter and the integrated instant power disagree by %+.1f %% under the current load: the power sensor samples part of each period and aliases with a periodic load (docs/accuracy.md); trainmeter reports the counter", g.DisagreementPct))
	}
	for what, n := range g.ReadErrors {
		add(VerdictWarn, fmt.Sprintf("%d failed reads (%s)", n, what))
	}
	if g.Verdict == VerdictPass {
		g.Reasons = append(g.Reasons, fmt.Sprintf("pass: counter updates every %.0f ms, %.0f %% of 50 ms reads stale as expected, counter and instant power agree within %.1f %%",
			g.EnergyUpdateMs, g.StaleEnergyPct, math.Abs(g.DisagreementPct)))
	}
}

// worse is the worse of two verdicts.
func worse(a, b string) string {
	order := []string{VerdictPass, VerdictWarn, VerdictFail}
	return order[max(slices.Index(order, a), slices.Index(order, b))]
}
