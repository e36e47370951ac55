package report

import (
	"cmp"
	"fmt"
)

// carbonSourceWords names where a CO2 band's intensity came from.
var carbonSourceWords = map[string]string{
	"file": "carbon file",
	"live": "live grid data",
	"flat": "flat --grid-gco2-kwh",
}

// writeCO2 writes the run's CO2 and, when it was not all at the flat
// factor, its split by zone and intensity (facility energy).
func writeCO2(line func(label, format string, args ...any), r *RunReport) {
	if r.Co2Kg == nil {
		line("CO2", "%s", "-")
		return
	}
	bands := r.GetCo2Bands()
	flatOnly := len(bands) <= 1 && (len(bands) == 0 || bands[0].GetSource() == "flat" && bands[0].GetZone() == "")
	if flatOnly {
		line("CO2", "%.4g kg", r.GetCo2Kg())
		return
	}
	zone := ""
	if z := r.GetCarbonZone(); z != "" {
		zone = ", zone " + z
	}
	line("CO2", "%.4g kg (whole run, all GPUs; %.4g gCO2/kWh energy-weighted%s)", r.GetCo2Kg(), r.GetCo2Gco2PerKwh(), zone)
	for _, b := range bands {
		label := fmt.Sprintf("  %s %.4g g/kWh", cmp.Or(b.GetZone(), "no zone"), b.GetGco2PerKwh())
		note := carbonSourceWords[b.GetSource()]
		if b.GetSource() == "flat" {
			note += ": no intensity for these hours"
		}
		line(label, "%.6g kWh = %.4g kg (%s)", b.GetKwh(), b.GetCo2Kg(), note)
	}
}
