package cost

import (
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const touYAML = `
zone: Europe/Berlin
default: peak
bands: {peak: 0.30, offpeak: 0.12, weekend: 0.10}
rules:
  - {days: [sat, sun], from: "00:00", to: "24:00", band: weekend}
  - {days: [weekdays], from: "22:00", to: "06:00", band: offpeak}
`

func mustTariff(t *testing.T, y string) *Tariff {
	t.Helper()
	tr, err := ParseTariff([]byte(y))
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

func berlin(t *testing.T, s string) time.Time {
	t.Helper()
	loc, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	at, err := time.ParseInLocation("2006-01-02 15:04:05", s, loc)
	if err != nil {
		t.Fatal(err)
	}
	return at
}

func TestBandAt(t *testing.T) {
	tr := mustTariff(t, touYAML)
	for _, c := range []struct{ at, want string }{
		{"2026-03-02 12:00:00", "peak"},    // Monday noon
		{"2026-03-02 21:59:59", "peak"},    // just before the switch
		{"2026-03-02 22:00:00", "offpeak"}, // Monday 22:00
		{"2026-03-03 05:59:59", "offpeak"}, // Tuesday morning: wraps from Monday
		{"2026-03-03 06:00:00", "peak"},
		{"2026-03-07 12:00:00", "weekend"}, // Saturday
		{"2026-03-09 03:00:00", "peak"},    // Monday 03:00: Sunday is not a weekday, no wrap into Monday
		{"2026-03-07 03:00:00", "weekend"}, // Saturday 03:00: the weekend rule comes first
	} {
		if got := tr.BandAt(berlin(t, c.at)); got != c.want {
			t.Errorf("BandAt(%s) = %s, want %s", c.at, got, c.want)
		}
	}
}

type booked map[string]float64

func split(tr *Tariff, start, end time.Time, j float64) booked {
	b := booked{}
	tr.Split(start, end, j, func(band string, j float64) { b[band] += j })
	return b
}

func near(t *testing.T, what string, got, want float64) {
	t.Helper()
	if math.Abs(got-want) > 1e-9*math.Max(1, math.Abs(want)) {
		t.Errorf("%s = %.12g, want %.12g", what, got, want)
	}
}

func TestSplitAtBoundaryIsProportional(t *testing.T) {
	tr := mustTariff(t, touYAML)
	// 21:59:30 to 22:00:10 on a Monday: 30 s peak, 10 s off-peak.
	b := split(tr, berlin(t, "2026-03-02 21:59:30"), berlin(t, "2026-03-02 22:00:10"), 400)
	near(t, "peak", b["peak"], 300)
	near(t, "offpeak", b["offpeak"], 100)
	if len(b) != 2 {
		t.Errorf("bands %v", b)
	}
	// A window inside one band is booked whole.
	b = split(tr, berlin(t, "2026-03-02 12:00:00.25"), berlin(t, "2026-03-02 12:00:01.25"), 7)
	near(t, "inside peak", b["peak"], 7)
	// Zero-length window: booked at its start's band.
	at := berlin(t, "2026-03-02 23:00:00")
	b = split(tr, at, at, 5)
	near(t, "zero-length", b["offpeak"], 5)
	// A window over two boundaries (off-peak Monday night → peak Tuesday morning is 8 h away, so
	// use a weekday → weekend crossing): Friday 21:30 → Saturday 00:30 is 30 min peak, 2 h
	// off-peak, 30 min weekend.
	b = split(tr, berlin(t, "2026-03-06 21:30:00"), berlin(t, "2026-03-07 00:30:00"), 180)
	near(t, "fri peak", b["peak"], 30)
	near(t, "fri offpeak", b["offpeak"], 120)
	near(t, "sat weekend", b["weekend"], 30)
}

func TestSplitOnDSTDays(t *testing.T) {
	tr := mustTariff(t, `
zone: Europe/Berlin
default: other
bands: {other: 0.2, early: 0.1}
rules: [{from: "02:00", to: "04:00", band: early}]
`)
	// Spring forward, 2026-03-29: 02:00 CET (01:00 UTC) becomes 03:00 CEST,
	// so local 02:00-04:00 is only 01:00-02:00 UTC. (A fixed CET offset would
	// book 01:00-02:30 UTC, 90 of the 120 J, as "early".)
	b := split(tr, time.Date(2026, 3, 29, 0, 30, 0, 0, time.UTC), time.Date(2026, 3, 29, 2, 30, 0, 0, time.UTC), 120)
	near(t, "spring other", b["other"], 60) // 00:30-01:00 and 02:00-02:30 UTC
	near(t, "spring early", b["early"], 60) // 01:00-02:00 UTC = 03:00-04:00 CEST (02:00-03:00 does not exist)
	// Fall back, 2026-10-25: 03:00 CEST (01:00 UTC) becomes 02:00 CET. Local
	// 02:00-04:00 lasts three hours: 00:00-03:00 UTC.
	b = split(tr, time.Date(2026, 10, 24, 23, 0, 0, 0, time.UTC), time.Date(2026, 10, 25, 4, 0, 0, 0, time.UTC), 300)
	near(t, "fall early", b["early"], 180)
	near(t, "fall other", b["other"], 120)
}

func TestZoneOffsetsNotWholeHours(t *testing.T) {
	// India is UTC+05:30: local 22:00 is 16:30 UTC.
	tr := mustTariff(t, `{zone: Asia/Kolkata, default: d, bands: {d: 1, n: 0.5}, rules: [{from: "22:00", to: "06:00", band: n}]}`)
	b := split(tr, time.Date(2026, 1, 5, 16, 29, 0, 0, time.UTC), time.Date(2026, 1, 5, 16, 31, 0, 0, time.UTC), 2)
	near(t, "d", b["d"], 1)
	near(t, "n", b["n"], 1)
}

func TestTariffValidation(t *testing.T) {
	for _, c := range []struct{ yaml, want string }{
		{`{default: a, bands: {a: 1}, zone: Mars/Olympus}`, `zone "Mars/Olympus"`},
		{`{default: a}`, "no bands"},
		{`{default: b, bands: {a: 1}}`, `default band "b"`},
		{`{default: a, bands: {a: -1}}`, "finite number >= 0"},
		{`{default: a, bands: {a: .nan}}`, "finite number >= 0"},
		{`{default: a, bands: {a: 1}, rules: [{from: "25:00", to: "06:00", band: a}]}`, `"25:00": out of range`},
		{`{default: a, bands: {a: 1}, rules: [{from: "7:00", to: "06:00", band: a}]}`, `"7:00": want HH:MM`},
		{`{default: a, bands: {a: 1}, rules: [{from: "06:60", to: "07:00", band: a}]}`, "out of range"},
		{`{default: a, bands: {a: 1}, rules: [{from: "06:00", to: "06:00", band: a}]}`, "empty"},
		{`{default: a, bands: {a: 1}, rules: [{from: "24:00", to: "06:00", band: a}]}`, "must start before midnight"},
		{`{default: a, bands: {a: 1}, rules: [{from: "01:00", to: "06:00", band: z}]}`, `band "z" is not one of the bands`},
		{`{default: a, bands: {a: 1}, rules: [{days: [funday], from: "01:00", to: "06:00", band: a}]}`, `day "funday"`},
		{`{default: a, bands: {a: 1}, colour: red}`, "field colour not found"},
		{`bands: [1, 2]`, "decode"},
		{"", "tariff file is empty"},
		{"# only a comment\n\n", "tariff file is empty"},
	} {
		_, err := ParseTariff([]byte(c.yaml))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("ParseTariff(%s) = %v, want an error with %q", c.yaml, err, c.want)
		}
	}
	if _, err := LoadTariff("/nonexistent/tariff.yaml"); err == nil {
		t.Error("LoadTariff of a missing file: no error")
	}
	empty := filepath.Join(t.TempDir(), "tariff.yaml")
	if err := os.WriteFile(empty, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadTariff(empty); err == nil || err.Error() != "tariff file is empty: "+empty {
		t.Errorf("LoadTariff of an empty file: %v", err)
	}
}

// splitByMinute is the obvious reference: the band can only change at a
// local minute boundary, so look at every one.
func splitByMinute(tr *Tariff, start, end time.Time, joules float64) booked {
	b := booked{}
	if !end.After(start) {
		b[tr.BandAt(start)] += joules
		return b
	}
	total := end.Sub(start).Seconds()
	cur := start
	for cur.Before(end) {
		lt := cur.In(tr.loc)
		next := cur.Add(time.Minute - time.Duration(lt.Second())*time.Second - time.Duration(lt.Nanosecond()))
		if next.After(end) {
			next = end
		}
		b[tr.BandAt(cur)] += joules * next.Sub(cur).Seconds() / total
		cur = next
	}
	return b
}

func TestSplitMatchesMinuteByMinuteReference(t *testing.T) {
	zones := []string{"UTC", "Europe/Berlin", "America/New_York", "Asia/Kolkata", "Australia/Lord_Howe", "America/St_Johns"}
	// Around DST changes of 2026 in the zones above, and an ordinary week.
	anchors := []time.Time{
		time.Date(2026, 3, 8, 0, 0, 0, 0, time.UTC), time.Date(2026, 3, 29, 0, 0, 0, 0, time.UTC),
		time.Date(2026, 4, 5, 0, 0, 0, 0, time.UTC), time.Date(2026, 10, 4, 0, 0, 0, 0, time.UTC),
		time.Date(2026, 10, 25, 0, 0, 0, 0, time.UTC), time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC),
		time.Date(2026, 6, 10, 0, 0, 0, 0, time.UTC),
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for _, zone := range zones {
		tr := mustTariff(t, `
zone: `+zone+`
default: peak
bands: {peak: 0.3, off: 0.1, shoulder: 0.2, weekend: 0.05}
rules:
  - {days: [sat], from: "00:00", to: "24:00", band: weekend}
  - {days: [weekdays], from: "22:30", to: "06:15", band: off}
  - {days: [mon, wed], from: "01:59", to: "03:01", band: shoulder}
  - {from: "16:00", to: "19:00", band: shoulder}
  - {from: "02:30", to: "03:30", band: shoulder}
`)
		for _, a := range anchors {
			for i := 0; i < 40; i++ {
				start := a.Add(time.Duration(rng.Int64N(int64(72 * time.Hour))))
				length := time.Duration(rng.Int64N(int64(30 * time.Hour)))
				if i%4 == 0 {
					length = time.Duration(rng.Int64N(int64(3 * time.Second)))
				}
				got, want := split(tr, start, start.Add(length), 1000), splitByMinute(tr, start, start.Add(length), 1000)
				for band := range tr.Bands {
					if math.Abs(got[band]-want[band]) > 1e-6 {
						t.Fatalf("%s %v + %v: band %s = %.9f, reference %.9f (got %v, want %v)", zone, start, length, band, got[band], want[band], got, want)
					}
				}
			}
		}
	}
}

func TestSplitOfAMonthIsCheap(t *testing.T) {
	tr := mustTariff(t, touYAML)
	calls := 0
	sum := 0.0
	start := berlin(t, "2026-03-01 00:00:00")
	tr.Split(start, start.Add(31*24*time.Hour), 744, func(_ string, j float64) { calls++; sum += j })
	near(t, "sum", sum, 744)
	// About two band changes per weekday and two per weekend: not one per minute.
	if calls > 100 {
		t.Errorf("%d bookings for a month", calls)
	}
}
