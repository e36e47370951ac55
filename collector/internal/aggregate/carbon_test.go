package aggregate

import (
	"math"
	"strconv"
	"testing"

	"github.com/trainmeter/trainmeter/collector/internal/pricing/cost"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

func carbonPricing(t testing.TB) Pricing {
	t.Helper()
	f, err := cost.ParseCarbonFile([]byte(`{zones: {DE: {default: 400, rules: [{from: "12:01", to: "24:00", gco2_kwh: 100}]}, FR: {default: 50}}}`))
	if err != nil {
		t.Fatal(err)
	}
	return Pricing{Carbon: cost.CarbonChain{f}, CarbonFile: f, CarbonZone: "DE", CarbonNodeZones: map[string]string{"b": "FR"}, GridGCO2PerKWh: 999}
}

// Two nodes in two zones, one window across DE's switch at 12:01: each
// part at its zone's intensity then, kept through the state's encoding.
func TestCO2PerNodeZoneAndThroughTheCodec(t *testing.T) {
	p := carbonPricing(t)
	s := New("r1")
	s.AddStart("a", &trainmeterv1.RunStart{RunId: "r1", Time: ts(0)})
	s.AddWindowBooked("a", &trainmeterv1.RunWindow{RunId: "r1", Start: ts(30), End: ts(90), EnergyCounterJ: 600, CounterOk: true}, nil, p)
	s.AddWindowBooked("b", &trainmeterv1.RunWindow{RunId: "r1", Start: ts(30), End: ts(90), EnergyCounterJ: 360, CounterOk: true}, nil, p)
	want := (300*400 + 300*100 + 360*50) / 3.6e9
	enc, err := s.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	back, err := Unmarshal(enc)
	if err != nil {
		t.Fatal(err)
	}
	for name, st := range map[string]*State{"folded": s, "decoded": back} {
		r := st.Report(p)
		if r.Co2Kg == nil || math.Abs(r.GetCo2Kg()-want) > 1e-15 || r.GetCarbonZone() != "DE" || r.GetCo2Source() != "file" || len(r.GetCo2Bands()) != 3 {
			t.Errorf("%s: co2 %v (want %v) zone %q source %q bands %v", name, r.GetCo2Kg(), want, r.GetCarbonZone(), r.GetCo2Source(), r.GetCo2Bands())
		}
	}
}

// BenchmarkAddWindowBooked is the cost per window of booking energy at
// ingest: none, a tariff, a carbon file, both.
func BenchmarkAddWindowBooked(b *testing.B) {
	tariff, err := cost.ParseTariff([]byte(`{default: off, bands: {off: 0.1, peak: 0.3}, rules: [{from: "12:01", to: "24:00", band: peak}]}`))
	if err != nil {
		b.Fatal(err)
	}
	p := carbonPricing(b)
	const secs = 3600
	windows := make([]*trainmeterv1.RunWindow, secs)
	for i := range windows {
		windows[i] = &trainmeterv1.RunWindow{RunId: "r1", Start: ts(float64(i)), End: ts(float64(i + 1)), EnergyCounterJ: 300, CounterOk: true, GpuSeconds: 1, Gpus: []uint32{0}}
	}
	for _, c := range []struct {
		name   string
		bands  EnergyBands
		carbon CarbonBooker
	}{{"none", nil, nil}, {"tariff", tariff, nil}, {"carbon-file", nil, p}, {"tariff+carbon-file", tariff, p}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				s := New("r1")
				for _, w := range windows {
					s.AddWindowBooked("node-"+strconv.Itoa(0), w, c.bands, c.carbon)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*secs), "ns/window")
		})
	}
}
