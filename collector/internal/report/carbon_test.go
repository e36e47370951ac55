package report

import (
	"strings"
	"testing"

	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// The report splits CO2 by zone and intensity when it was not all at the
// flat factor; a flat-only run keeps its one line.
func TestReportCO2Split(t *testing.T) {
	r := &trainmeterv1.RunReport{RunId: "r", Ended: true, Co2Kg: f64(0.0133), Co2Gco2PerKwh: f64(295.6), Co2Source: "mixed", CarbonZone: "DE",
		Co2Bands: []*trainmeterv1.CarbonBand{
			{Zone: "DE", Source: "live", Kwh: 0.0157, Gco2PerKwh: 100, Co2Kg: 0.00157},
			{Zone: "DE", Source: "flat", Kwh: 0.0294, Gco2PerKwh: 400, Co2Kg: 0.0118},
		}}
	var b strings.Builder
	if err := WriteReport(&b, r); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"  CO2:               0.0133 kg (whole run, all GPUs; 295.6 gCO2/kWh energy-weighted, zone DE)\n",
		"    DE 100 g/kWh:    0.0157 kWh = 0.00157 kg (live grid data)\n",
		"    DE 400 g/kWh:    0.0294 kWh = 0.0118 kg (flat --grid-gco2-kwh: no intensity for these hours)\n",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, b.String())
		}
	}
	flat := &trainmeterv1.RunReport{RunId: "f", Co2Kg: f64(0.5), Co2Source: "flat",
		Co2Bands: []*trainmeterv1.CarbonBand{{Source: "flat", Kwh: 1.25, Gco2PerKwh: 400, Co2Kg: 0.5}}}
	b.Reset()
	if err := WriteReport(&b, flat); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "  CO2:               0.5 kg\n") || strings.Contains(b.String(), "g/kWh") {
		t.Errorf("flat-only report:\n%s", b.String())
	}
}
