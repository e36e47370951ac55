package cost

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Carbon sources, as CarbonBand.source and RunReport.co2_source name them.
const (
	CarbonSourceFile  = "file"
	CarbonSourceLive  = "live"
	CarbonSourceFlat  = "flat"
	CarbonSourceMixed = "mixed"
)

// CarbonSource gives the grid's carbon intensity where and when energy was
// consumed. SplitCarbon books joules consumed uniformly over [start, end)
// in zone: add for each stretch whose intensity it knows (gCO2/kWh, and
// the source that gave it), missing for each stretch it does not.
type CarbonSource interface {
	SplitCarbon(zone string, start, end time.Time, joules float64,
		add func(gPerKWh float64, source string, joules float64), missing func(start, end time.Time, joules float64))
}

// CarbonChain asks its sources in order: what one does not cover goes to
// the next (a live source first, the file for the hours it lacks).
type CarbonChain []CarbonSource

func (c CarbonChain) SplitCarbon(zone string, start, end time.Time, joules float64,
	add func(float64, string, float64), missing func(time.Time, time.Time, float64)) {
	if len(c) == 0 {
		missing(start, end, joules)
		return
	}
	c[0].SplitCarbon(zone, start, end, joules, add, func(s, e time.Time, j float64) {
		c[1:].SplitCarbon(zone, s, e, j, add, missing)
	})
}

// CarbonFile is a schedule of grid carbon intensity (gCO2/kWh) by weekday
// and time of day, per zone (docs/costs.md, "Carbon file"). A zone's rules
// are the tariff's rules (days, from, to; wrapping past midnight, DST on
// the local wall clock) with an intensity instead of a band: each zone
// compiles to a Tariff whose bands are its intensities.
type CarbonFile struct {
	Zones map[string]CarbonZone `yaml:"zones"`

	compiled map[string]*Tariff
}

// CarbonZone is one zone's schedule.
type CarbonZone struct {
	Timezone string       `yaml:"timezone"`
	Default  *float64     `yaml:"default"`
	Rules    []CarbonRule `yaml:"rules"`
}

// CarbonRule is one schedule line of a CarbonZone.
type CarbonRule struct {
	Days    []string `yaml:"days"`
	From    string   `yaml:"from"`
	To      string   `yaml:"to"`
	GCO2KWh *float64 `yaml:"gco2_kwh"`
}

// ErrEmptyCarbonFile: the carbon file has no YAML document.
var ErrEmptyCarbonFile = errors.New("carbon file is empty")

// LoadCarbonFile reads and validates a carbon intensity file (YAML).
func LoadCarbonFile(path string) (*CarbonFile, error) {
	return loadYAML[CarbonFile](path, "carbon file", ErrEmptyCarbonFile)
}

// ParseCarbonFile decodes a carbon file (unknown keys are errors) and
// validates it.
func ParseCarbonFile(b []byte) (*CarbonFile, error) {
	return parseYAML[CarbonFile](b, ErrEmptyCarbonFile)
}

func intensityName(g float64) string { return strconv.FormatFloat(g, 'g', -1, 64) }

// ValidZoneName: zone names go into booking keys ("ZONE|SOURCE|G") and
// ElectricityMaps URLs, so they are plain tokens.
func ValidZoneName(z string) error {
	if z == "" {
		return errors.New("empty zone name")
	}
	if strings.ContainsAny(z, "|/?&#% \t\r\n") {
		return fmt.Errorf("zone %q: a zone name has no spaces or any of | / ? & # %%", z)
	}
	return nil
}

func validIntensity(g float64) bool { return !math.IsNaN(g) && !math.IsInf(g, 0) && g >= 0 }

// Validate checks the file and prepares it for SplitCarbon and Schedule.
func (f *CarbonFile) Validate() error {
	var errs []error
	if len(f.Zones) == 0 {
		errs = append(errs, errors.New("no zones: give at least one zone with its default gco2_kwh"))
	}
	compiled := map[string]*Tariff{}
	for _, name := range f.ZoneNames() {
		z := f.Zones[name]
		if err := ValidZoneName(name); err != nil {
			errs = append(errs, err)
			continue
		}
		if z.Default == nil || !validIntensity(*z.Default) {
			errs = append(errs, fmt.Errorf("zone %s: default must be a finite gCO2/kWh >= 0", name))
			continue
		}
		t := &Tariff{Zone: z.Timezone, Default: intensityName(*z.Default), Bands: map[string]float64{intensityName(*z.Default): *z.Default}}
		bad := false
		for i, r := range z.Rules {
			if r.GCO2KWh == nil || !validIntensity(*r.GCO2KWh) {
				errs = append(errs, fmt.Errorf("zone %s: rule %d: gco2_kwh must be a finite number >= 0", name, i+1))
				bad = true
				continue
			}
			n := intensityName(*r.GCO2KWh)
			t.Bands[n] = *r.GCO2KWh
			t.Rules = append(t.Rules, TariffRule{Days: r.Days, From: r.From, To: r.To, Band: n})
		}
		if bad {
			continue
		}
		if err := t.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("zone %s: %w", name, err))
			continue
		}
		compiled[name] = t
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	f.compiled = compiled
	return nil
}

// ZoneNames lists the file's zones, sorted.
func (f *CarbonFile) ZoneNames() []string { return slices.Sorted(maps.Keys(f.Zones)) }

// Schedule is zone's schedule as a tariff whose bands are intensities
// (gCO2/kWh); false for a zone the file does not have.
func (f *CarbonFile) Schedule(zone string) (*Tariff, bool) {
	t, ok := f.compiled[zone]
	return t, ok
}

// SplitCarbon implements CarbonSource: a zone the file has is covered at
// every instant.
func (f *CarbonFile) SplitCarbon(zone string, start, end time.Time, joules float64,
	add func(float64, string, float64), missing func(time.Time, time.Time, float64)) {
	t, ok := f.compiled[zone]
	if !ok {
		missing(start, end, joules)
		return
	}
	t.Split(start, end, joules, func(band string, j float64) { add(t.Bands[band], CarbonSourceFile, j) })
}

// CarbonKey is the aggregate's booking key for energy consumed in zone at
// gPerKWh from source; the flat fallback has no intensity of its own
// (it is the flat factor at report time).
func CarbonKey(zone, source string, gPerKWh float64) string {
	if source == CarbonSourceFlat {
		return zone + "|" + CarbonSourceFlat + "|"
	}
	return zone + "|" + source + "|" + intensityName(gPerKWh)
}

// ParseCarbonKey undoes CarbonKey; ok is false for a key it did not make.
func ParseCarbonKey(k string) (zone, source string, gPerKWh float64, ok bool) {
	parts := strings.Split(k, "|")
	if len(parts) != 3 {
		return "", "", 0, false
	}
	zone, source = parts[0], parts[1]
	if source == CarbonSourceFlat {
		return zone, source, 0, parts[2] == ""
	}
	g, err := strconv.ParseFloat(parts[2], 64)
	if err != nil || !validIntensity(g) || (source != CarbonSourceFile && source != CarbonSourceLive) {
		return "", "", 0, false
	}
	return zone, source, g, true
}

// CarbonZoneOf is node's carbon zone: its own (--carbon-node-zone), else
// the default (--carbon-zone), else the carbon file's only zone; "" when
// none applies.
func (c Config) CarbonZoneOf(node string) string {
	if z, ok := c.CarbonNodeZones[node]; ok {
		return z
	}
	if c.CarbonZone != "" {
		return c.CarbonZone
	}
	if c.CarbonFile != nil && len(c.CarbonFile.Zones) == 1 {
		for z := range c.CarbonFile.Zones { // the only one: nothing to sort per window
			return z
		}
	}
	return ""
}

// BookCarbon books a window of node's energy, consumed over [start, end),
// to the intensities in force in the node's zone: add is called with each
// part's booking key (CarbonKey). Parts no source covers are booked to the
// zone's flat key, priced at --grid-gco2-kwh at report time. Nothing is
// booked without a carbon source.
func (c Config) BookCarbon(node string, start, end time.Time, joules float64, add func(key string, joules float64)) {
	if c.Carbon == nil {
		return
	}
	zone := c.CarbonZoneOf(node)
	if zone == "" {
		add(CarbonKey("", CarbonSourceFlat, 0), joules)
		return
	}
	c.Carbon.SplitCarbon(zone, start, end, joules,
		func(g float64, src string, j float64) { add(CarbonKey(zone, src, g), j) },
		func(_, _ time.Time, j float64) { add(CarbonKey(zone, CarbonSourceFlat, 0), j) })
}

// CarbonBand is the part of a run's facility energy consumed at one
// intensity in one zone, and its CO2.
type CarbonBand struct {
	Zone, Source string
	KWh          float64 // facility energy (GPU energy × PUE)
	GPerKWh, Kg  float64
}

// CO2 is a run's CO2: each part of its energy booked at ingest (byBand,
// J, CarbonKey keys) at its intensity, and the rest of totalJ (energy
// booked to no intensity: folded while no carbon source was configured,
// or in hours no source covered) at --grid-gco2-kwh, the facility
// overhead (PUE) included. ok is false when some energy has no intensity
// at all (no flat factor for the rest): CO2 is then unknown, never
// partial.
func (c Config) CO2(byBand map[string]float64, totalJ float64) (kg float64, bands []CarbonBand, ok bool) {
	pue := c.EffectivePUE()
	type k struct {
		zone, source string
		g            float64
	}
	perBand := map[k]float64{}
	booked := 0.0
	for key, j := range byBand {
		zone, src, g, valid := ParseCarbonKey(key)
		if !valid {
			continue // counted in the rest below
		}
		if src == CarbonSourceFlat {
			g = c.GridGCO2PerKWh
		}
		perBand[k{zone, src, g}] += j
		booked += j
	}
	if rest := totalJ - booked; rest > 1e-9*math.Max(1, totalJ) {
		perBand[k{"", CarbonSourceFlat, c.GridGCO2PerKWh}] += rest
	}
	if len(perBand) == 0 {
		if c.Carbon != nil && totalJ == 0 {
			return 0, nil, true // nothing drawn: nothing emitted, whatever the intensity
		}
		if c.GridGCO2PerKWh <= 0 {
			return 0, nil, false
		}
		perBand[k{"", CarbonSourceFlat, c.GridGCO2PerKWh}] = totalJ
	}
	keys := slices.SortedFunc(maps.Keys(perBand), func(a, b k) int {
		return cmp.Or(strings.Compare(a.zone, b.zone), strings.Compare(a.source, b.source), cmp.Compare(a.g, b.g))
	})
	for _, b := range keys {
		if b.source == CarbonSourceFlat && c.GridGCO2PerKWh <= 0 && perBand[b] > 0 {
			return 0, nil, false
		}
		kwh := perBand[b] * pue / 3.6e6
		bands = append(bands, CarbonBand{Zone: b.zone, Source: b.source, KWh: kwh, GPerKWh: b.g, Kg: kwh * b.g / 1000})
		kg += kwh * b.g / 1000
	}
	return kg, bands, true
}

// CO2Summary is what the report says of a run's CO2 besides the total:
// its energy-weighted intensity, where the intensities came from, and the
// zone most of its energy was consumed in.
func CO2Summary(bands []CarbonBand) (gPerKWh float64, source, zone string) {
	var kwh, kg float64
	byZone := map[string]float64{}
	for _, b := range bands {
		kwh += b.KWh
		kg += b.Kg
		switch {
		case source == "":
			source = b.Source
		case source != b.Source:
			source = CarbonSourceMixed
		}
		if b.Zone != "" {
			byZone[b.Zone] += b.KWh
		}
	}
	if kwh > 0 {
		gPerKWh = kg * 1000 / kwh
	}
	if len(byZone) > 0 { // the first zone of the most energy, in name order
		zone = slices.MaxFunc(slices.Sorted(maps.Keys(byZone)), func(a, b string) int { return cmp.Compare(byZone[a], byZone[b]) })
	}
	return gPerKWh, source, zone
}
