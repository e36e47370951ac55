package recommend

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/trainmeter/trainmeter/collector/internal/pricing/cost"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// scheduled is an ended run of model in zone DE: wall hours from start,
// drawing kwh over them.
func scheduled(id, model string, start time.Time, hours, kwh float64) Run {
	return Run{Report: &trainmeterv1.RunReport{RunId: id, Metadata: &trainmeterv1.RunMetadata{Model: model},
		Ended: true, Start: timestamppb.New(start), WallS: hours * 3600, EnergyTotalJ: kwh * 3.6e6, CarbonZone: "DE"}}
}

func carbonFile(t *testing.T, y string) *cost.CarbonFile {
	t.Helper()
	f, err := cost.ParseCarbonFile([]byte(y))
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func tariff(t *testing.T, y string) *cost.Tariff {
	t.Helper()
	tr, err := cost.ParseTariff([]byte(y))
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

// DE's grid at 400 gCO2/kWh but 100 from 01:00 to 05:00 (UTC).
const cleanNights = `zones: {DE: {default: 400, rules: [{from: "01:00", to: "05:00", gco2_kwh: 100}]}}`

var day = time.Date(2026, 11, 24, 14, 0, 0, 0, time.UTC) // a Tuesday

func TestScheduleMovesARepeatedRunToTheCleanestHours(t *testing.T) {
	runs := []Run{
		scheduled("nightly-1", "m", day.Add(-24*time.Hour), 2, 1.8),
		scheduled("nightly-2", "m", day, 2, 2), // the template: the latest
		scheduled("once", "other", day, 2, 2),  // not repeated
	}
	recs := Schedule(runs, ScheduleInputs{Carbon: carbonFile(t, cleanNights)})
	if len(recs) != 1 {
		t.Fatalf("recommendations %v, want one for model m", recs)
	}
	r := recs[0]
	// 2 kWh at 14:00 is 800 g; at 01:00-03:00 it is 200 g: 75 % less.
	if r.GetKind() != KindSchedule || r.GetModel() != "m" || r.GetTitle() != "Run m at 01:00–03:00 (DE, UTC time): 75% less CO2 per run" {
		t.Errorf("title %q", r.GetTitle())
	}
	approx(t, "savings_co2_kg", r.GetSavingsCo2Kg(), 0.6)
	if r.GetSavingsUsd() != 0 || r.GetSavingsJ() != 0 || len(r.GetRunIds()) != 1 || r.GetRunIds()[0] != "nightly-2" {
		t.Errorf("savings $%v %v J runs %v", r.GetSavingsUsd(), r.GetSavingsJ(), r.GetRunIds())
	}
	if !strings.Contains(r.GetEvidence(), "2 ended runs of m (nightly-1, nightly-2)") || !strings.Contains(r.GetEvidence(), "CO2 0.8 kg → 0.2 kg") {
		t.Errorf("evidence %q", r.GetEvidence())
	}

	// With a PUE of 1.5 the facility emits half as much again, and saves it.
	recs = Schedule(runs, ScheduleInputs{Carbon: carbonFile(t, cleanNights), PUE: 1.5})
	approx(t, "savings_co2_kg at PUE 1.5", recs[0].GetSavingsCo2Kg(), 0.9)
}

func TestScheduleOnlyWhenItPays(t *testing.T) {
	runs := []Run{scheduled("a", "m", day.Add(-time.Hour*48), 2, 2), scheduled("b", "m", day, 2, 2)}
	// 380 at night instead of 400: 5 %, under the 10 % threshold.
	if recs := Schedule(runs, ScheduleInputs{Carbon: carbonFile(t, `zones: {DE: {default: 400, rules: [{from: "01:00", to: "05:00", gco2_kwh: 380}]}}`)}); len(recs) != 0 {
		t.Errorf("a 5%% saving recommended: %v", recs[0].GetTitle())
	}
	// Already at the cleanest hours.
	night := []Run{scheduled("a", "m", day.Add(-24*time.Hour), 2, 2), scheduled("b", "m", time.Date(2026, 11, 24, 1, 0, 0, 0, time.UTC), 2, 2)}
	if recs := Schedule(night, ScheduleInputs{Carbon: carbonFile(t, cleanNights)}); len(recs) != 0 {
		t.Errorf("a run already at the cleanest hours: %v", recs[0].GetTitle())
	}
	// One run is not a repeated run; a zone the file lacks has no schedule.
	if recs := Schedule(runs[1:], ScheduleInputs{Carbon: carbonFile(t, cleanNights)}); len(recs) != 0 {
		t.Errorf("a single run: %v", recs)
	}
	if recs := Schedule(runs, ScheduleInputs{Carbon: carbonFile(t, `zones: {FR: {default: 50}}`)}); len(recs) != 0 {
		t.Errorf("zone DE not in the file: %v", recs)
	}
}

// With a tariff too: the cheapest hours get their own recommendation when
// they are not the cleanest; each states the other objective at its hour.
func TestScheduleCleanestAndCheapest(t *testing.T) {
	runs := []Run{scheduled("a", "m", day.Add(-24*time.Hour), 2, 2), scheduled("b", "m", day, 2, 2)}
	// Off-peak 22:00-06:00: the clean 01:00-03:00 is off-peak too, so one
	// hour is both the cleanest and (of the cheapest) the cleanest.
	both := ScheduleInputs{Carbon: carbonFile(t, cleanNights),
		Tariff: tariff(t, "default: peak\nbands: {peak: 0.30, offpeak: 0.10}\nrules: [{from: \"22:00\", to: \"06:00\", band: offpeak}]\n")}
	recs := Schedule(runs, both)
	if len(recs) != 1 || !strings.HasPrefix(recs[0].GetTitle(), "Run m at 01:00–03:00") {
		t.Fatalf("recommendations %v, want one at 01:00", recs)
	}
	approx(t, "savings_usd", recs[0].GetSavingsUsd(), 2*(0.30-0.10))
	approx(t, "savings_co2_kg", recs[0].GetSavingsCo2Kg(), 0.6)

	// Off-peak only 18:00-20:00: two hours, two recommendations.
	apart := ScheduleInputs{Carbon: both.Carbon,
		Tariff: tariff(t, "default: peak\nbands: {peak: 0.30, offpeak: 0.10}\nrules: [{from: \"18:00\", to: \"20:00\", band: offpeak}]\n")}
	recs = Schedule(runs, apart)
	if len(recs) != 2 {
		t.Fatalf("recommendations %v, want two", recs)
	}
	var clean, cheap *trainmeterv1.Recommendation
	for _, r := range recs {
		if strings.Contains(r.GetTitle(), "CO2") {
			clean = r
		} else {
			cheap = r
		}
	}
	if clean == nil || cheap == nil || !strings.HasPrefix(cheap.GetTitle(), "Run m at 18:00–20:00 (UTC): 67% less energy cost") {
		t.Fatalf("clean %v cheap %v", clean, cheap)
	}
	approx(t, "cheap savings_usd", cheap.GetSavingsUsd(), 0.4)
	if cheap.GetSavingsCo2Kg() != 0 || clean.GetSavingsUsd() != 0 {
		t.Errorf("the cheap hour saves %v kg, the clean hour $%v; both are at the default otherwise", cheap.GetSavingsCo2Kg(), clean.GetSavingsUsd())
	}
}
