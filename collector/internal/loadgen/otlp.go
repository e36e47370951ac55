package loadgen

import (
	colmetricspb "go.opentelemetry.io/proto/otlp/collector/metrics/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	metricspb "go.opentelemetry.io/proto/otlp/metrics/v1"
	resourcepb "go.opentelemetry.io/proto/otlp/resource/v1"

	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// OTLPRequest is the OTLP form of batch b of node: one data point per GPU
// per metric (the window's energy as a delta sum; average and max power, memory
// used, utilization and the sample count as gauges), the GPU index as a
// point attribute, the node as the resource (what an OTel-native GPU
// exporter would send for the same samples).
func OTLPRequest(node string, b *trainmeterv1.Batch) *colmetricspb.ExportMetricsServiceRequest {
	start := uint64(b.GetWindowStart().AsTime().UnixNano())
	end := uint64(b.GetWindowEnd().AsTime().UnixNano())
	type col struct {
		name, unit string
		sum        bool
		val        func(*trainmeterv1.GpuWindow) float64
	}
	cols := []col{
		{"gpu.energy", "J", true, func(g *trainmeterv1.GpuWindow) float64 { return g.GetEnergyCounterJ() }},
		{"gpu.power.avg", "W", false, func(g *trainmeterv1.GpuWindow) float64 { return g.GetPowerAvgW() }},
		{"gpu.power.max", "W", false, func(g *trainmeterv1.GpuWindow) float64 { return g.GetPowerMaxW() }},
		{"gpu.memory.used", "MiBy", false, func(g *trainmeterv1.GpuWindow) float64 { return g.GetMemoryUsedAvgMib() }},
		{"gpu.utilization", "%", false, func(g *trainmeterv1.GpuWindow) float64 { return g.GetUtilizationAvgPct() }},
		{"gpu.samples", "{sample}", false, func(g *trainmeterv1.GpuWindow) float64 { return float64(g.GetSamples()) }},
	}
	ms := make([]*metricspb.Metric, 0, len(cols))
	for _, c := range cols {
		pts := make([]*metricspb.NumberDataPoint, 0, len(b.GetGpuWindows()))
		for _, g := range b.GetGpuWindows() {
			pts = append(pts, &metricspb.NumberDataPoint{
				Attributes:        []*commonpb.KeyValue{{Key: "gpu", Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_IntValue{IntValue: int64(g.GetGpu())}}}},
				StartTimeUnixNano: start, TimeUnixNano: end,
				Value: &metricspb.NumberDataPoint_AsDouble{AsDouble: c.val(g)},
			})
		}
		m := &metricspb.Metric{Name: c.name, Unit: c.unit}
		if c.sum {
			m.Data = &metricspb.Metric_Sum{Sum: &metricspb.Sum{DataPoints: pts, IsMonotonic: true,
				AggregationTemporality: metricspb.AggregationTemporality_AGGREGATION_TEMPORALITY_DELTA}}
		} else {
			m.Data = &metricspb.Metric_Gauge{Gauge: &metricspb.Gauge{DataPoints: pts}}
		}
		ms = append(ms, m)
	}
	return &colmetricspb.ExportMetricsServiceRequest{ResourceMetrics: []*metricspb.ResourceMetrics{{
		Resource: &resourcepb.Resource{Attributes: []*commonpb.KeyValue{
			{Key: "host.name", Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: node}}},
			{Key: "service.name", Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: "trainmeter-loadgen"}}},
		}},
		ScopeMetrics: []*metricspb.ScopeMetrics{{Scope: &commonpb.InstrumentationScope{Name: "trainmeter"}, Metrics: ms}},
	}}}
}
