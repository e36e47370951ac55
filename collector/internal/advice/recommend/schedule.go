package recommend

import (
	"fmt"
	"math"
	"sort"
	"strings"
	"time"

	"github.com/trainmeter/trainmeter/collector/internal/pricing/cost"
	"github.com/trainmeter/trainmeter/internal/money"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
	"google.golang.org/protobuf/proto"
)

// KindSchedule: "run it at HH:00–HH:00": start a repeated run at the hours
// of its day when the grid is cleanest (or the tariff cheapest).
const KindSchedule = "schedule"

// Schedule rule thresholds (docs/recommendations.md).
const (
	// ScheduleMinRuns: a model is a repeated run with at least this many
	// ended runs that drew energy.
	ScheduleMinRuns = 2
	// ScheduleMinSaving: another start hour is recommended when it saves
	// at least this share of the run's CO2 (or of its energy cost).
	ScheduleMinSaving = 0.10
)

// ScheduleInputs are what the schedule rule moves runs in: the carbon
// file (typical intensity by weekday and hour per zone) and the
// time-of-use tariff, each nil when not configured, and the PUE.
type ScheduleInputs struct {
	Carbon *cost.CarbonFile
	Tariff *cost.Tariff
	PUE    float64
}

// scheduleObjective is one thing a start hour can lower: CO2 in a zone's
// schedule, or energy cost in the tariff. Both are a Tariff whose bands
// hold the value per kWh (gCO2 or $).
type scheduleObjective struct {
	name     string // "CO2", "energy cost"
	schedule *cost.Tariff
	where    string // "zone DE" or "the tariff"
}

// perRun is the objective's value for a run of d at facility power watts
// starting at start: Σ over the bands it runs in of kWh × value per kWh.
func (o scheduleObjective) perRun(start time.Time, d time.Duration, watts float64) float64 {
	var v float64
	o.schedule.Split(start, start.Add(d), watts*d.Seconds(), func(band string, j float64) {
		v += j / 3.6e6 * o.schedule.Bands[band]
	})
	return v
}

// Schedule: for each model with at least ScheduleMinRuns ended runs, the
// latest is the template: its facility energy (energy_total_J × PUE) spread
// evenly over its wall time, moved to each whole hour of the same local day.
// The hour with the least CO2 (zone schedule) and the one with the least
// energy cost (tariff) are recommended when they save at least
// ScheduleMinSaving of the template at its actual start, computed alike (the
// typical day against itself, not against the live intensity the run was
// booked at). One recommendation per objective, one if both pick an hour.
func Schedule(runs []Run, in ScheduleInputs) []*trainmeterv1.Recommendation {
	if in.Carbon == nil && in.Tariff == nil {
		return nil
	}
	pue := in.PUE
	if pue < 1 || math.IsNaN(pue) || math.IsInf(pue, 0) {
		pue = 1
	}
	byModel := groupBy(runs, func(r Run) string {
		if rep := r.Report; !rep.GetEnded() || rep.GetWallS() <= 0 || rep.GetEnergyTotalJ() <= 0 || rep.GetStart() == nil {
			return ""
		}
		return modelOf(r)
	})
	var out []*trainmeterv1.Recommendation
	for _, model := range sortedKeys(byModel) {
		group := byModel[model]
		if len(group) < ScheduleMinRuns {
			continue
		}
		sort.SliceStable(group, func(i, j int) bool {
			return group[i].Report.GetStart().AsTime().Before(group[j].Report.GetStart().AsTime())
		})
		out = append(out, scheduleModel(model, group, in, pue)...)
	}
	return out
}

type scheduleChoice struct {
	obj      scheduleObjective
	start    time.Time
	base     float64 // the objective at the template's actual start
	best     float64
	fraction float64 // 1 − best ÷ base
}

func scheduleModel(model string, group []Run, in ScheduleInputs, pue float64) []*trainmeterv1.Recommendation {
	tmpl := group[len(group)-1].Report
	d := time.Duration(tmpl.GetWallS() * float64(time.Second))
	watts := tmpl.GetEnergyTotalJ() * pue / tmpl.GetWallS()
	actual := tmpl.GetStart().AsTime()
	var objs []scheduleObjective
	zone := tmpl.GetCarbonZone()
	if in.Carbon != nil && zone != "" {
		if s, ok := in.Carbon.Schedule(zone); ok {
			objs = append(objs, scheduleObjective{name: "CO2", schedule: s, where: "zone " + zone})
		}
	}
	if in.Tariff != nil {
		objs = append(objs, scheduleObjective{name: "energy cost", schedule: in.Tariff, where: "the tariff"})
	}
	// others is the objectives other than o at start, each as a share of
	// its value at the actual start: among hours equally good for o, the
	// one better for the others wins (the cheapest of the cleanest hours).
	others := func(o scheduleObjective, start time.Time) float64 {
		var sum float64
		for _, x := range objs {
			if x.name != o.name {
				if b := x.perRun(actual, d, watts); b > 0 {
					sum += x.perRun(start, d, watts) / b
				}
			}
		}
		return sum
	}
	var choices []scheduleChoice
	for _, o := range objs {
		base := o.perRun(actual, d, watts)
		if base <= 0 {
			continue
		}
		c := scheduleChoice{obj: o, start: actual, base: base, best: base}
		bestOthers := others(o, actual)
		loc := o.schedule.Location()
		lt := actual.In(loc)
		for h := range 24 {
			s := time.Date(lt.Year(), lt.Month(), lt.Day(), h, 0, 0, 0, loc)
			v, ot := o.perRun(s, d, watts), others(o, s)
			tie := math.Abs(v-c.best) <= 1e-9*base
			if (!tie && v < c.best) || (tie && ot < bestOthers-1e-9) {
				c.start, c.best, bestOthers = s, v, ot
			}
		}
		c.fraction = 1 - c.best/c.base
		if c.fraction >= ScheduleMinSaving {
			choices = append(choices, c)
		}
	}
	if len(choices) == 2 && choices[0].start.Equal(choices[1].start) {
		choices = choices[:1] // one hour is the cleanest and the cheapest: one recommendation
	}
	var out []*trainmeterv1.Recommendation
	for _, c := range choices {
		out = append(out, scheduleRecommendation(model, group, c, objs, d, watts))
	}
	return out
}

func scheduleRecommendation(model string, group []Run, c scheduleChoice, objs []scheduleObjective, d time.Duration, watts float64) *trainmeterv1.Recommendation {
	tmpl := group[len(group)-1].Report
	actual := tmpl.GetStart().AsTime()
	loc := c.obj.schedule.Location()
	window := hourWindow(c.start.In(loc), d)
	place := loc.String()
	if strings.HasPrefix(c.obj.where, "zone ") {
		place = strings.TrimPrefix(c.obj.where, "zone ") + ", " + loc.String() + " time"
	}
	rec := &trainmeterv1.Recommendation{
		Kind:  KindSchedule,
		Model: model,
		Title: fmt.Sprintf("Run %s at %s (%s): %.0f%% less %s per run", model, window, place, 100*c.fraction, c.obj.name),
		Action: fmt.Sprintf("Start the next runs of %s at %s %s instead of %s (run %s started then and ran %s)",
			model, c.start.In(loc).Format("15:04"), loc, actual.In(loc).Format("15:04"), tmpl.GetRunId(), d.Round(time.Second)),
		Confidence: 0.7,
		Risks: []string{"the schedule is a typical day: the grid's intensity (or the tariff) on the day the run goes may differ",
			"the next run is taken to be like the last (same length and power); a queue or people may not allow that start"},
		RunIds: []string{tmpl.GetRunId()},
	}
	// State every objective at the recommended hour, saved or not.
	var effects []string
	for _, o := range objs {
		base, moved := o.perRun(actual, d, watts), o.perRun(c.start, d, watts)
		switch o.name {
		case "CO2":
			kg := (base - moved) / 1000 // g → kg
			rec.SavingsCo2Kg = proto.Float64(max(0, kg))
			effects = append(effects, fmt.Sprintf("CO2 %.4g kg → %.4g kg per run (%s)", base/1000, moved/1000, o.where))
		default:
			rec.SavingsUsd = proto.Float64(max(0, base-moved))
			effects = append(effects, fmt.Sprintf("energy cost %s → %s per run (%s)", money.USD(base), money.USD(moved), o.where))
		}
	}
	rec.Evidence = fmt.Sprintf("repeated run: %d ended runs of %s (%s); the latest, %s, drew %.4g kWh (× PUE) over %s; moved to each whole hour of its day: %s",
		len(group), model, strings.Join(runIDs(group), ", "), tmpl.GetRunId(), watts*d.Seconds()/3.6e6, d.Round(time.Second), strings.Join(effects, "; "))
	return rec
}

// hourWindow words the hours a run of d starting at start covers,
// "02:00–06:00", rounded out to whole hours.
func hourWindow(start time.Time, d time.Duration) string {
	if d >= 24*time.Hour {
		return fmt.Sprintf("%s (runs %s)", start.Format("15:04"), d.Round(time.Minute))
	}
	end := start.Add((d + time.Hour - 1) / time.Hour * time.Hour) // start is on a whole hour
	return fmt.Sprintf("%s–%s", start.Format("15:04"), end.Format("15:04"))
}
