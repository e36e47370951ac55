package otelexport

import (
	"context"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/trainmeter/trainmeter/pkg/clock"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// gpuPoint is one collected hw.* data point.
type gpuPoint struct {
	value float64
	start time.Time
	attrs attribute.Set
}

// gpuHarness feeds a GPUMetrics and collects it with a manual reader, as the
// SDK's periodic reader or the Prometheus exporter would.
type gpuHarness struct {
	t      *testing.T
	clk    *clock.Fake
	reader *sdkmetric.ManualReader
	g      *GPUMetrics
}

func newGPUHarness(t *testing.T, inventory map[string][]*trainmeterv1.GpuInfo) *gpuHarness {
	t.Helper()
	clk := clock.NewFake(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	o := GPUOptions{Clock: clk}
	if inventory != nil {
		o.Inventory = func() map[string][]*trainmeterv1.GpuInfo { return inventory }
	}
	g, err := NewGPUMetrics(mp.Meter(ScopeName), o)
	if err != nil {
		t.Fatal(err)
	}
	return &gpuHarness{t: t, clk: clk, reader: reader, g: g}
}

// collect returns every hw.* point by metric name.
func (h *gpuHarness) collect() map[string][]gpuPoint {
	h.t.Helper()
	var rm metricdata.ResourceMetrics
	if err := h.reader.Collect(context.Background(), &rm); err != nil {
		h.t.Fatal(err)
	}
	out := map[string][]gpuPoint{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Gauge[float64]:
				for _, p := range d.DataPoints {
					out[m.Name] = append(out[m.Name], gpuPoint{p.Value, p.StartTime, p.Attributes})
				}
			case metricdata.Sum[float64]:
				if d.Temporality != metricdata.CumulativeTemporality || !d.IsMonotonic {
					h.t.Fatalf("%s: temporality %v monotonic %v, want a cumulative counter", m.Name, d.Temporality, d.IsMonotonic)
				}
				for _, p := range d.DataPoints {
					out[m.Name] = append(out[m.Name], gpuPoint{p.Value, p.StartTime, p.Attributes})
				}
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					out[m.Name] = append(out[m.Name], gpuPoint{float64(p.Value), p.StartTime, p.Attributes})
				}
			default:
				h.t.Fatalf("%s: unexpected data %T", m.Name, d)
			}
		}
	}
	return out
}

// one returns the single point of name, failing if there is not exactly one.
func (h *gpuHarness) one(pts map[string][]gpuPoint, name string) gpuPoint {
	h.t.Helper()
	if len(pts[name]) != 1 {
		h.t.Fatalf("%s: %d points, want 1: %v", name, len(pts[name]), pts[name])
	}
	return pts[name][0]
}

func attr(s attribute.Set, k string) string {
	v, _ := s.Value(attribute.Key(k))
	return v.AsString()
}

// window is a 1 s window of a 300 W GPU whose hardware counter gave j joules.
func window(gpu uint32, uuid string, j float64) *trainmeterv1.GpuWindow {
	return &trainmeterv1.GpuWindow{Gpu: gpu, Uuid: uuid, EnergyCounterJ: j, CounterOk: true, EnergyIntegratedJ: j + 1,
		PowerAvgW: 300, Samples: 20, UtilizationAvgPct: 95, MemoryUsedAvgMib: 1000, MemoryTotalMib: 80000}
}

func batch(ws ...*trainmeterv1.GpuWindow) *trainmeterv1.Batch {
	return &trainmeterv1.Batch{GpuWindows: ws}
}

// A GPU that sends nothing for longer than StaleAfter loses its gauges but
// not its energy total: hw.energy stays exported at its total, and when the
// GPU comes back it goes on from there under the same start time, so the
// cumulative counter never goes down. Only after EnergyTTL is it forgotten.
func TestEnergyIsKeptAcrossAGap(t *testing.T) {
	h := newGPUHarness(t, nil)
	for range 10 {
		h.g.Batch("n1", batch(window(0, "GPU-a", 300)))
		h.clk.Advance(time.Second)
	}
	pts := h.collect()
	before := h.one(pts, MetricHWEnergy)
	if before.value != 3000 || len(pts[MetricHWPower]) != 1 {
		t.Fatalf("energy %v J, %d power points; want 3000 J and 1", before.value, len(pts[MetricHWPower]))
	}

	h.clk.Advance(DefaultGPUStaleAfter + time.Minute) // the agent is gone for 3 min
	pts = h.collect()
	for _, name := range []string{MetricHWPower, MetricHWGPUUtilization, MetricHWGPUMemoryUsage, MetricHWGPUMemoryLimit} {
		if len(pts[name]) != 0 {
			t.Errorf("%s still exported for a GPU without a window for 3 min: %v", name, pts[name])
		}
	}
	if p := h.one(pts, MetricHWEnergy); p.value != before.value || !p.start.Equal(before.start) {
		t.Errorf("during the gap hw.energy = %v J (start %v), want the total %v J (start %v)", p.value, p.start, before.value, before.start)
	}

	// Back, first with a window without samples: energy goes on, the old
	// gauges are not repeated as if they were current.
	h.g.Batch("n1", batch(&trainmeterv1.GpuWindow{Gpu: 0, Uuid: "GPU-a", EnergyCounterJ: 5, CounterOk: true}))
	pts = h.collect()
	after := h.one(pts, MetricHWEnergy)
	if after.value < before.value || after.value != 3005 || !after.start.Equal(before.start) {
		t.Fatalf("after the gap hw.energy = %v J (start %v), want 3005 J, not below %v J, same start %v", after.value, after.start, before.value, before.start)
	}
	if len(pts[MetricHWPower]) != 0 {
		t.Errorf("hw.power %v after the gap before any fresh sample", pts[MetricHWPower])
	}
	h.g.Batch("n1", batch(window(0, "GPU-a", 300)))
	pts = h.collect()
	if p := h.one(pts, MetricHWPower); p.value != 300 {
		t.Errorf("hw.power %v after a fresh window, want 300", p.value)
	}
	if p := h.one(pts, MetricHWEnergy); p.value != 3305 {
		t.Errorf("hw.energy %v, want 3305", p.value)
	}

	// After the TTL the GPU is forgotten.
	h.clk.Advance(DefaultGPUEnergyTTL + time.Second)
	if pts := h.collect(); len(pts) != 0 {
		t.Errorf("GPU still exported %v after the energy TTL", pts)
	}
	if n := len(h.g.gpus); n != 0 {
		t.Errorf("%d GPUs still kept after the energy TTL", n)
	}
}

// A backend without GPU UUIDs: hw.id falls back to NODE/gpuINDEX, and two
// nodes' GPU 0 stay two series.
func TestHWIDWithoutUUID(t *testing.T) {
	h := newGPUHarness(t, nil)
	h.g.Batch("n1", batch(window(3, "", 100)))
	h.g.Batch("n2", batch(window(3, "", 200)))
	h.g.Batch("n2", batch(window(1, "GPU-uuid", 50)))
	got := map[string]string{}
	for _, p := range h.collect()[MetricHWEnergy] {
		id := attr(p.attrs, AttrHWID)
		got[id] = attr(p.attrs, AttrHWName) + " " + attr(p.attrs, AttrNode) + " " + attr(p.attrs, AttrHWType)
		if id == "n2/gpu3" && p.value != 200 {
			t.Errorf("n2/gpu3 energy %v, want 200", p.value)
		}
	}
	want := map[string]string{"n1/gpu3": "n1/gpu3 n1 gpu", "n2/gpu3": "n2/gpu3 n2 gpu", "GPU-uuid": "n2/gpu1 n2 gpu"}
	if len(got) != len(want) {
		t.Fatalf("hw.id values %v, want %v", got, want)
	}
	for id, v := range want {
		if got[id] != v {
			t.Errorf("hw.id %s: hw.name, node, type = %q, want %q", id, got[id], v)
		}
	}
}

// Energy comes from the hardware counter where the agent says it is valid,
// else from the integrated power.
func TestEnergyFallsBackToIntegratedPower(t *testing.T) {
	h := newGPUHarness(t, nil)
	h.g.Batch("n", batch(
		&trainmeterv1.GpuWindow{Gpu: 0, Uuid: "GPU-counter", EnergyCounterJ: 310, CounterOk: true, EnergyIntegratedJ: 290, Samples: 20},
		&trainmeterv1.GpuWindow{Gpu: 1, Uuid: "GPU-nocounter", EnergyCounterJ: 9999, CounterOk: false, EnergyIntegratedJ: 290, Samples: 20},
	))
	h.g.Batch("n", batch(
		&trainmeterv1.GpuWindow{Gpu: 0, Uuid: "GPU-counter", EnergyCounterJ: 305, CounterOk: true, EnergyIntegratedJ: 1, Samples: 20},
		&trainmeterv1.GpuWindow{Gpu: 1, Uuid: "GPU-nocounter", CounterOk: false, EnergyIntegratedJ: 295, Samples: 20},
	))
	want := map[string]float64{"GPU-counter": 615, "GPU-nocounter": 585}
	pts := h.collect()[MetricHWEnergy]
	if len(pts) != 2 {
		t.Fatalf("hw.energy points %v, want 2", pts)
	}
	for _, p := range pts {
		if id := attr(p.attrs, AttrHWID); p.value != want[id] {
			t.Errorf("hw.energy of %s = %v J, want %v J", id, p.value, want[id])
		}
	}
}

// A window in which nothing could be read (zero samples) still adds its
// energy, but never makes up gauges: before any sample there are none, and
// after one the last figures stay.
func TestZeroSampleWindows(t *testing.T) {
	inv := map[string][]*trainmeterv1.GpuInfo{"n": {{Index: 0, Uuid: "GPU-z", Name: "NVIDIA H100 80GB HBM3", MemoryTotalMib: 81559}}}
	h := newGPUHarness(t, inv)
	h.g.Batch("n", batch(&trainmeterv1.GpuWindow{Gpu: 0, Uuid: "GPU-z", EnergyIntegratedJ: 0, Samples: 0}))
	pts := h.collect()
	if p := h.one(pts, MetricHWEnergy); p.value != 0 || attr(p.attrs, AttrHWModel) != "NVIDIA H100 80GB HBM3" || attr(p.attrs, AttrHWVendor) != "NVIDIA" {
		t.Errorf("hw.energy %v %v, want 0 J with the model and vendor from the inventory", p.value, p.attrs)
	}
	for _, name := range []string{MetricHWPower, MetricHWGPUUtilization, MetricHWGPUMemoryUsage, MetricHWGPUMemoryLimit} {
		if len(pts[name]) != 0 {
			t.Errorf("%s %v before any sample", name, pts[name])
		}
	}

	w := window(0, "GPU-z", 300)
	w.MemoryTotalMib = 0 // the size then comes from the inventory
	h.g.Batch("n", batch(w))
	h.g.Batch("n", batch(&trainmeterv1.GpuWindow{Gpu: 0, Uuid: "GPU-z", EnergyCounterJ: 250, CounterOk: true, Samples: 0, PowerAvgW: 0}))
	pts = h.collect()
	for name, want := range map[string]float64{
		MetricHWEnergy: 550, MetricHWPower: 300, MetricHWGPUUtilization: 0.95,
		MetricHWGPUMemoryUsage: 1000 << 20, MetricHWGPUMemoryLimit: 81559 << 20,
	} {
		if p := h.one(pts, name); p.value != want {
			t.Errorf("%s = %v after a zero-sample window, want %v", name, p.value, want)
		}
	}
}
