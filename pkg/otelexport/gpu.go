package otelexport

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"

	"github.com/trainmeter/trainmeter/pkg/clock"
)

// Metric names of the OTel hardware semantic conventions (hw.*) that
// trainmeter exports per GPU, and the attributes it sets on them.
const (
	MetricHWPower          = "hw.power"
	MetricHWEnergy         = "hw.energy"
	MetricHWGPUUtilization = "hw.gpu.utilization"
	MetricHWGPUMemoryUsage = "hw.gpu.memory.usage"
	MetricHWGPUMemoryLimit = "hw.gpu.memory.limit"

	AttrHWType   = "hw.type"
	AttrHWID     = "hw.id"
	AttrHWName   = "hw.name"
	AttrHWVendor = "hw.vendor"
	AttrHWModel  = "hw.model"
	// AttrNode is the trainmeter node (agent) the GPU belongs to. It is a
	// data point attribute, not host.name: the collector exports the GPUs
	// of every node under its own resource.
	AttrNode = "trainmeter.node"
)

// DefaultGPUStaleAfter is how long a GPU's gauges (hw.power,
// hw.gpu.utilization, hw.gpu.memory.*) keep being reported after its last
// window: then they stop (their series end) until data comes again.
const DefaultGPUStaleAfter = 2 * time.Minute

// DefaultGPUEnergyTTL is how long a GPU's hw.energy total is kept, and
// reported, after its last window. Within it, a GPU that comes back goes on
// from its total, so the cumulative counter never goes down under the same
// start time; after it the GPU is forgotten, and one that comes back later
// starts again from 0 (a counter reset, as after a restart of the exporter).
const DefaultGPUEnergyTTL = 24 * time.Hour

// GPUMetrics turns the agents' per-GPU batch windows into the hw.* metrics.
// Feed it with Batch; the SDK reads it on every collection.
type GPUMetrics struct {
	clock                 clock.Clock
	staleAfter, energyTTL time.Duration
	inventory             func() map[string][]*trainmeterv1.GpuInfo

	mu   sync.Mutex
	gpus map[gpuKey]*gpuState
}

type gpuKey struct {
	node string
	id   string // the GPU UUID, or gpu<index> when the backend has none
}

type gpuState struct {
	node, uuid                                            string
	index                                                 uint32
	powerW, utilization, memUsedMiB, memTotalMiB, energyJ float64
	lastSeen                                              time.Time
	hasGauges                                             bool
}

// GPUOptions configure NewGPUMetrics.
type GPUOptions struct {
	Clock      clock.Clock   // for staleness; the wall clock if nil
	StaleAfter time.Duration // 0: DefaultGPUStaleAfter
	EnergyTTL  time.Duration // 0: DefaultGPUEnergyTTL; at least StaleAfter
	// Inventory returns each node's GPUs (from its Hello) for the name,
	// vendor and model attributes; called once per collection. May be nil.
	Inventory func() map[string][]*trainmeterv1.GpuInfo
}

// NewGPUMetrics registers the hw.* instruments on meter.
func NewGPUMetrics(meter metric.Meter, o GPUOptions) (*GPUMetrics, error) {
	g := &GPUMetrics{clock: cmp.Or[clock.Clock](o.Clock, clock.Real{}), staleAfter: o.StaleAfter, energyTTL: o.EnergyTTL, inventory: o.Inventory, gpus: map[gpuKey]*gpuState{}}
	if g.staleAfter <= 0 {
		g.staleAfter = DefaultGPUStaleAfter
	}
	if g.energyTTL <= 0 {
		g.energyTTL = DefaultGPUEnergyTTL
	}
	g.energyTTL = max(g.energyTTL, g.staleAfter)
	var (
		errs              [5]error
		power, util       metric.Float64ObservableGauge
		energy            metric.Float64ObservableCounter
		memUsed, memLimit metric.Int64ObservableUpDownCounter
	)
	power, errs[0] = meter.Float64ObservableGauge(MetricHWPower, metric.WithUnit("W"),
		metric.WithDescription("GPU power draw, averaged over the agent's last 1 s window"))
	energy, errs[1] = meter.Float64ObservableCounter(MetricHWEnergy, metric.WithUnit("J"),
		metric.WithDescription("GPU energy consumed since the exporter started (hardware counter where available, else integrated power)"))
	util, errs[2] = meter.Float64ObservableGauge(MetricHWGPUUtilization, metric.WithUnit("1"),
		metric.WithDescription("GPU utilization (0..1), averaged over the last window"))
	memUsed, errs[3] = meter.Int64ObservableUpDownCounter(MetricHWGPUMemoryUsage, metric.WithUnit("By"),
		metric.WithDescription("GPU memory used, averaged over the last window"))
	memLimit, errs[4] = meter.Int64ObservableUpDownCounter(MetricHWGPUMemoryLimit, metric.WithUnit("By"),
		metric.WithDescription("GPU memory size"))
	if err := cmp.Or(errs[:]...); err != nil {
		return nil, err
	}
	_, err := meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		for _, s := range g.snapshot() {
			opt := metric.WithAttributeSet(s.attrs)
			o.ObserveFloat64(energy, s.energyJ, opt)
			if !s.hasGauges {
				continue
			}
			o.ObserveFloat64(power, s.powerW, opt)
			o.ObserveFloat64(util, s.utilization, opt)
			o.ObserveInt64(memUsed, int64(s.memUsedMiB*(1<<20)), opt)
			if s.memTotalMiB > 0 {
				o.ObserveInt64(memLimit, int64(s.memTotalMiB*(1<<20)), opt)
			}
		}
		return nil
	}, power, energy, util, memUsed, memLimit)
	if err != nil {
		return nil, err
	}
	return g, nil
}

// Batch folds one batch of node into the GPU figures. It must see each
// batch once (the collector's OnApplied hook guarantees it); nil-safe.
func (g *GPUMetrics) Batch(node string, b *trainmeterv1.Batch) {
	if g == nil || len(b.GetGpuWindows()) == 0 {
		return
	}
	now := g.clock.Now()
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, w := range b.GetGpuWindows() {
		id := cmp.Or(w.GetUuid(), fmt.Sprintf("gpu%d", w.GetGpu()))
		k := gpuKey{node, id}
		s := g.gpus[k]
		switch {
		case s == nil:
			g.pruneLocked(now) // the map only grows here
			s = &gpuState{node: node, index: w.GetGpu(), uuid: w.GetUuid()}
			g.gpus[k] = s
		case now.Sub(s.lastSeen) > g.staleAfter:
			// Back after a gap: the energy total goes on, the gauges
			// wait for fresh samples instead of repeating old ones.
			s.hasGauges = false
		}
		if w.GetCounterOk() {
			s.energyJ += w.GetEnergyCounterJ()
		} else {
			s.energyJ += w.GetEnergyIntegratedJ()
		}
		s.lastSeen = now
		if w.GetSamples() == 0 {
			continue // nothing was read in this window: keep the last figures
		}
		s.hasGauges = true
		s.powerW = w.GetPowerAvgW()
		s.utilization = w.GetUtilizationAvgPct() / 100
		s.memUsedMiB = w.GetMemoryUsedAvgMib()
		if w.GetMemoryTotalMib() > 0 {
			s.memTotalMiB = w.GetMemoryTotalMib()
		}
	}
}

type gpuSnapshot struct {
	gpuState
	attrs attribute.Set
}

// pruneLocked forgets the GPUs without a window for longer than energyTTL.
func (g *GPUMetrics) pruneLocked(now time.Time) {
	for k, s := range g.gpus {
		if now.Sub(s.lastSeen) > g.energyTTL {
			delete(g.gpus, k)
		}
	}
}

// snapshot returns the GPUs seen within energyTTL, forgetting older ones;
// those not seen within staleAfter have hasGauges false (energy only).
func (g *GPUMetrics) snapshot() []gpuSnapshot {
	var inv map[string][]*trainmeterv1.GpuInfo
	if g.inventory != nil {
		inv = g.inventory()
	}
	now := g.clock.Now()
	g.mu.Lock()
	defer g.mu.Unlock()
	g.pruneLocked(now)
	out := make([]gpuSnapshot, 0, len(g.gpus))
	for k, s := range g.gpus {
		var info *trainmeterv1.GpuInfo
		for _, gi := range inv[s.node] {
			if (s.uuid != "" && gi.GetUuid() == s.uuid) || (s.uuid == "" && gi.GetIndex() == s.index) {
				info = gi
				break
			}
		}
		snap := gpuSnapshot{gpuState: *s}
		if now.Sub(s.lastSeen) > g.staleAfter {
			snap.hasGauges = false // stale: energy total only
		}
		if snap.memTotalMiB == 0 && info != nil {
			snap.memTotalMiB = float64(info.GetMemoryTotalMib())
		}
		attrs := []attribute.KeyValue{
			attribute.String(AttrHWType, "gpu"),
			attribute.String(AttrHWID, cmp.Or(s.uuid, s.node+"/"+k.id)),
			attribute.String(AttrHWName, fmt.Sprintf("%s/gpu%d", s.node, s.index)),
			attribute.String(AttrNode, s.node),
		}
		if info != nil && info.GetName() != "" {
			attrs = append(attrs, attribute.String(AttrHWModel, info.GetName()), attribute.String(AttrHWVendor, gpuVendor(info)))
		}
		snap.attrs = attribute.NewSet(attrs...)
		out = append(out, snap)
	}
	return out
}

// gpuVendor is the vendor the agent's backend named, else a guess from the
// model name (agents before GpuInfo.vendor, simulated GPUs).
func gpuVendor(info *trainmeterv1.GpuInfo) string {
	switch info.GetVendor() {
	case "nvidia":
		return "NVIDIA"
	case "amd":
		return "AMD"
	}
	return Vendor(info.GetName())
}

// Vendor guesses the GPU vendor from its model name (NVML reports names such
// as "NVIDIA H100 80GB HBM3"; older boards "Tesla V100-SXM2-16GB").
func Vendor(model string) string {
	words := strings.FieldsFunc(strings.ToUpper(model), func(c rune) bool {
		return !(c >= 'A' && c <= 'Z' || c >= '0' && c <= '9')
	})
	for _, v := range []struct{ vendor, hints string }{
		{"NVIDIA", "NVIDIA TESLA GEFORCE QUADRO RTX TITAN A100 H100 H200 B200 GB200 L40 L4 A10 A30 A40 T4 V100"},
		{"AMD", "AMD RADEON INSTINCT MI300 MI250 MI210 MI100"},
		{"Intel", "INTEL ARC GAUDI"},
	} {
		for _, h := range strings.Fields(v.hints) {
			if slices.Contains(words, h) {
				return v.vendor
			}
		}
	}
	return "unknown"
}
