package cost

import (
	"math"
	"strings"
	"testing"
	"time"
)

const carbonYAML = `
zones:
  DE:
    timezone: Europe/Berlin
    default: 380
    rules:
      - {days: [weekdays], from: "11:00", to: "16:00", gco2_kwh: 240}
      - {days: [weekends], from: "00:00", to: "24:00", gco2_kwh: 300}
  FR:
    default: 50
`

func mustCarbon(t *testing.T, y string) *CarbonFile {
	t.Helper()
	f, err := ParseCarbonFile([]byte(y))
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func TestCarbonFileIntensityByWeekdayAndHour(t *testing.T) {
	f := mustCarbon(t, carbonYAML)
	for _, c := range []struct {
		zone, at string // at: UTC
		want     float64
	}{
		{"DE", "2026-11-24T09:59:59Z", 380}, // Tuesday 10:59:59 in Berlin
		{"DE", "2026-11-24T10:00:00Z", 240}, // 11:00 Berlin
		{"DE", "2026-11-24T14:59:59Z", 240},
		{"DE", "2026-11-24T15:00:00Z", 380},
		{"DE", "2026-11-28T12:00:00Z", 300}, // Saturday
		{"FR", "2026-11-24T12:00:00Z", 50},
	} {
		at, _ := time.Parse(time.RFC3339, c.at)
		if g, ok := intensityAt(f, c.zone, at); !ok || g != c.want {
			t.Errorf("%s at %s: %v %v, want %v", c.zone, c.at, g, ok, c.want)
		}
	}
	if _, ok := intensityAt(f, "PL", time.Now()); ok {
		t.Error("a zone the file does not have has an intensity")
	}
}

func TestCarbonFileErrors(t *testing.T) {
	for name, c := range map[string]struct{ yaml, want string }{
		"no zones":         {"zones: {}", "no zones"},
		"no default":       {"zones: {DE: {rules: []}}", "zone DE: default"},
		"negative default": {"zones: {DE: {default: -1}}", "zone DE: default"},
		"rule without g":   {`zones: {DE: {default: 1, rules: [{from: "01:00", to: "02:00"}]}}`, "rule 1: gco2_kwh"},
		"bad time":         {`zones: {DE: {default: 1, rules: [{from: "1:00", to: "02:00", gco2_kwh: 3}]}}`, "want HH:MM"},
		"bad timezone":     {"zones: {DE: {default: 1, timezone: Mars/Olympus}}", "Mars/Olympus"},
		"unknown key":      {"zones: {DE: {default: 1, intensity: 3}}", "intensity"},
		"bad zone name":    {"zones: {\"D E\": {default: 1}}", "no spaces"},
		"empty":            {"# nothing\n", "empty"},
	} {
		_, err := ParseCarbonFile([]byte(c.yaml))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error with %q", name, err, c.want)
		}
	}
}

// A window across a rule edge is split in proportion to time; a zone the
// file lacks goes to missing; the chain hands a live source's misses to
// the file.
func TestBookCarbonSplitsAndFallsBack(t *testing.T) {
	f := mustCarbon(t, carbonYAML)
	c := Config{Carbon: CarbonChain{f}, CarbonFile: f, CarbonNodeZones: map[string]string{"pl-node": "PL"}, CarbonZone: "DE", GridGCO2PerKWh: 500}
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), `"PL" is not in the carbon file`) {
		t.Errorf("a node zone the file lacks, without a live source: %v", err)
	}
	c.CarbonLive = true // a live source could answer for PL; here it never does
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	byBand := map[string]float64{}
	add := func(k string, j float64) { byBand[k] += j }
	at, _ := time.Parse(time.RFC3339, "2026-11-24T09:59:30Z") // 10:59:30 Berlin, a Tuesday
	c.BookCarbon("de-node", at, at.Add(2*time.Minute), 1200, add)
	c.BookCarbon("pl-node", at, at.Add(time.Minute), 360, add)
	want := map[string]float64{"DE|file|380": 300, "DE|file|240": 900, "PL|flat|": 360}
	for k, j := range want {
		if math.Abs(byBand[k]-j) > 1e-9 {
			t.Errorf("%s: %v J, want %v (all: %v)", k, byBand[k], j, byBand)
		}
	}
	// Facility energy (PUE 1.5); 100 J folded before any booking is the
	// rest, at the flat factor like the uncovered zone.
	c.PUE = 1.5
	kg, bands, ok := c.CO2(byBand, 1200+360+100)
	wantKg := 1.5 * (300*380 + 900*240 + 360*500 + 100*500) / 3.6e6 / 1000
	if !ok || math.Abs(kg-wantKg) > 1e-15 {
		t.Fatalf("co2 %v %v, want %v", kg, ok, wantKg)
	}
	if len(bands) != 4 || bands[0].Zone != "" || bands[0].Source != CarbonSourceFlat || bands[3].Zone != "PL" || bands[3].GPerKWh != 500 {
		t.Errorf("bands %+v", bands)
	}
	g, src, zone := CO2Summary(bands)
	if src != CarbonSourceMixed || zone != "DE" || math.Abs(g-wantKg*1000/(1.5*1660/3.6e6)) > 1e-9 {
		t.Errorf("summary %v %q %q", g, src, zone)
	}
	// Without a flat factor the uncovered energy has no intensity: CO2 is
	// unknown rather than partial.
	c.GridGCO2PerKWh = 0
	if _, _, ok := c.CO2(byBand, 1660); ok {
		t.Error("CO2 known though 460 J had no intensity")
	}
	// Covered entirely by the file: known without a flat factor.
	if kg, _, ok := c.CO2(map[string]float64{"DE|file|380": 3.6e6}, 3.6e6); !ok || math.Abs(kg-1.5*0.38) > 1e-12 {
		t.Errorf("1 kWh at 380 g with PUE 1.5: %v %v", kg, ok)
	}
}

func TestCO2FlatAsBefore(t *testing.T) {
	c := Config{GridGCO2PerKWh: 400}
	kg, bands, ok := c.CO2(nil, 3.6e6)
	if !ok || kg != 0.4 || len(bands) != 1 || bands[0].Source != CarbonSourceFlat {
		t.Errorf("1 kWh flat at 400 g: %v %v %v", kg, bands, ok)
	}
	if _, _, ok := (Config{}).CO2(nil, 3.6e6); ok {
		t.Error("CO2 known without any intensity")
	}
	// A run that drew nothing emitted nothing once a carbon source is
	// configured, flat factor or not.
	f := mustCarbon(t, carbonYAML)
	if kg, _, ok := (Config{Carbon: f, CarbonFile: f}).CO2(nil, 0); !ok || kg != 0 {
		t.Errorf("no energy: %v %v", kg, ok)
	}
}

func TestCarbonKeyRoundTrip(t *testing.T) {
	for _, k := range []struct {
		zone, src string
		g         float64
	}{{"DE", "file", 380}, {"US-CAL-CISO", "live", 212.75}, {"", "flat", 0}} {
		z, s, g, ok := ParseCarbonKey(CarbonKey(k.zone, k.src, k.g))
		if !ok || z != k.zone || s != k.src || g != k.g {
			t.Errorf("%v: %q %q %v %v", k, z, s, g, ok)
		}
	}
	for _, bad := range []string{"DE|file", "DE|file|x", "DE|wind|3", "DE|file|-1", "DE|flat|3"} {
		if _, _, _, ok := ParseCarbonKey(bad); ok {
			t.Errorf("%q parsed", bad)
		}
	}
}

// intensityAt is zone's intensity at at by the file's schedule.
func intensityAt(f *CarbonFile, zone string, at time.Time) (float64, bool) {
	s, ok := f.Schedule(zone)
	if !ok {
		return 0, false
	}
	return s.Bands[s.BandAt(at)], true
}
