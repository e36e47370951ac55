package cost

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strings"
	"time"
	_ "time/tzdata" // tariffs name IANA zones; work on machines without zoneinfo

	"gopkg.in/yaml.v3"
)

// Tariff is a time-of-use energy tariff: named bands with a price each, and
// rules that say which band is in force at a given local time of a given
// weekday, in the IANA zone Zone (default UTC); the file is docs/costs.md's
// "Tariff file". A flat tariff is one band and no rules.
//
// Rules are tried in order; the first that covers the time wins. A rule
// covers [from, to) on each of its days; when to <= from it wraps past
// midnight: [from, 24:00) on its days and [00:00, to) on the day after each.
// Times have minute resolution, so the band can only change at a local
// minute boundary; DST is handled by evaluating the rules on local wall time.
type Tariff struct {
	Zone    string             `yaml:"zone"`
	Default string             `yaml:"default"`
	Bands   map[string]float64 `yaml:"bands"`
	Rules   []TariffRule       `yaml:"rules"`

	loc      *time.Location
	compiled []compiledRule
	edges    []int // sorted minutes of the day (1..1439) at which a rule starts or ends
}

// TariffRule is one schedule line of a Tariff.
type TariffRule struct {
	Days []string `yaml:"days"` // mon..sun, weekdays, weekends, all; empty = all
	From string   `yaml:"from"` // HH:MM
	To   string   `yaml:"to"`   // HH:MM, 24:00 allowed
	Band string   `yaml:"band"`
}

type compiledRule struct {
	days     [7]bool // indexed by time.Weekday
	from, to int     // minutes of the day, to in (0, 1440]
	wraps    bool
	band     string
}

var dayNames = map[string][]time.Weekday{
	"sun": {time.Sunday}, "mon": {time.Monday}, "tue": {time.Tuesday}, "wed": {time.Wednesday},
	"thu": {time.Thursday}, "fri": {time.Friday}, "sat": {time.Saturday},
	"weekdays": {time.Monday, time.Tuesday, time.Wednesday, time.Thursday, time.Friday},
	"weekends": {time.Saturday, time.Sunday},
	"all":      {time.Sunday, time.Monday, time.Tuesday, time.Wednesday, time.Thursday, time.Friday, time.Saturday},
}

// LoadTariff reads and validates a tariff file (YAML).
func LoadTariff(path string) (*Tariff, error) {
	return loadYAML[Tariff](path, "tariff", ErrEmptyTariff)
}

// ErrEmptyTariff: the tariff has no YAML document (an empty file, or only
// comments).
var ErrEmptyTariff = errors.New("tariff file is empty")

// ParseTariff decodes a tariff (YAML; unknown keys are errors) and validates it.
func ParseTariff(b []byte) (*Tariff, error) {
	return parseYAML[Tariff](b, ErrEmptyTariff)
}

// parseYAML decodes one YAML document into a T, refusing unknown keys
// (a typo must not pass as a default), and validates it; empty is the
// error for a file with no document.
func parseYAML[T any, P interface {
	*T
	Validate() error
}](b []byte, empty error) (*T, error) {
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	v := P(new(T))
	if err := dec.Decode(v); errors.Is(err, io.EOF) {
		return nil, empty
	} else if err != nil {
		return nil, fmt.Errorf("decode: %w", err)
	}
	if err := v.Validate(); err != nil {
		return nil, err
	}
	return (*T)(v), nil
}

// loadYAML reads path and parses it with parseYAML; what names the file
// in errors.
func loadYAML[T any, P interface {
	*T
	Validate() error
}](path, what string, empty error) (*T, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	v, err := parseYAML[T, P](b, empty)
	if errors.Is(err, empty) {
		return nil, fmt.Errorf("%w: %s", err, path)
	}
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", what, path, err)
	}
	return v, nil
}

func parseClock(s string) (int, error) {
	bad := len(s) != 5 || s[2] != ':'
	for i := 0; !bad && i < 5; i++ {
		bad = i != 2 && (s[i] < '0' || s[i] > '9')
	}
	if bad {
		return 0, fmt.Errorf("time %q: want HH:MM", s)
	}
	h := int(s[0]-'0')*10 + int(s[1]-'0')
	m := int(s[3]-'0')*10 + int(s[4]-'0')
	if m > 59 || h > 24 || (h == 24 && m != 0) {
		return 0, fmt.Errorf("time %q: out of range (00:00 to 24:00)", s)
	}
	return h*60 + m, nil
}

// Validate checks the tariff and prepares it for BandAt and Split. It must
// be called (ParseTariff and LoadTariff do) before a hand-built tariff is used.
func (t *Tariff) Validate() error {
	var errs []error
	zone := cmp.Or(t.Zone, "UTC")
	loc, err := time.LoadLocation(zone)
	if err != nil {
		errs = append(errs, fmt.Errorf("zone %q: %v", t.Zone, err))
	}
	if len(t.Bands) == 0 {
		errs = append(errs, errors.New("no bands: give at least one band with its $/kWh"))
	}
	for name, p := range t.Bands {
		if name == "" {
			errs = append(errs, errors.New("a band has an empty name"))
		}
		if math.IsNaN(p) || math.IsInf(p, 0) || p < 0 {
			errs = append(errs, fmt.Errorf("band %q: price must be a finite number >= 0 $/kWh, got %v", name, p))
		}
	}
	if _, ok := t.Bands[t.Default]; !ok {
		errs = append(errs, fmt.Errorf("default band %q is not one of the bands", t.Default))
	}
	compiled := make([]compiledRule, 0, len(t.Rules))
	for i, r := range t.Rules {
		c := compiledRule{band: r.Band}
		if _, ok := t.Bands[r.Band]; !ok {
			errs = append(errs, fmt.Errorf("rule %d: band %q is not one of the bands", i+1, r.Band))
		}
		days := r.Days
		if len(days) == 0 {
			days = []string{"all"}
		}
		for _, d := range days {
			wd, ok := dayNames[strings.ToLower(d)]
			if !ok {
				errs = append(errs, fmt.Errorf("rule %d: day %q: want mon..sun, weekdays, weekends or all", i+1, d))
			}
			for _, w := range wd {
				c.days[w] = true
			}
		}
		from, err1 := parseClock(r.From)
		to, err2 := parseClock(r.To)
		if err1 != nil || err2 != nil {
			errs = append(errs, fmt.Errorf("rule %d: %w", i+1, errors.Join(err1, err2)))
			continue
		}
		if from == 1440 {
			errs = append(errs, fmt.Errorf("rule %d: from 24:00: a rule must start before midnight", i+1))
		}
		if from == to {
			errs = append(errs, fmt.Errorf("rule %d: from %s equals to %s (empty; for a whole day use 00:00 to 24:00)", i+1, r.From, r.To))
		}
		c.from, c.to, c.wraps = from, to, to < from
		compiled = append(compiled, c)
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	t.loc, t.compiled = loc, compiled
	t.edges = t.edges[:0]
	for _, c := range compiled {
		for _, m := range []int{c.from, c.to} {
			if m > 0 && m < 1440 && !slices.Contains(t.edges, m) {
				t.edges = append(t.edges, m)
			}
		}
	}
	slices.Sort(t.edges)
	return nil
}

// Location is the zone the rules are written in.
func (t *Tariff) Location() *time.Location { return t.loc }

// BandAt returns the band in force at at.
func (t *Tariff) BandAt(at time.Time) string {
	lt := at.In(t.loc)
	minute := lt.Hour()*60 + lt.Minute()
	day := lt.Weekday()
	prev := (day + 6) % 7
	for _, r := range t.compiled {
		// A wrapping rule runs from its from on its days to its to on the day after.
		today := r.days[day] && minute >= r.from && (r.wraps || minute < r.to)
		if today || (r.wraps && r.days[prev] && minute < r.to) {
			return r.band
		}
	}
	return t.Default
}

// Split books joules consumed uniformly over [start, end) to the bands in
// force, proportionally to the time spent in each: add is called once per
// contiguous stretch of one band. A window with end <= start is booked
// whole at start's band.
//
// Split walks from one possible band change to the next (nextEdge): a few
// steps per day of the window, not one per minute.
func (t *Tariff) Split(start, end time.Time, joules float64, add func(band string, joules float64)) {
	if !end.After(start) {
		add(t.BandAt(start), joules)
		return
	}
	total := end.Sub(start).Seconds()
	band, segStart := t.BandAt(start), start
	for cur := start; cur.Before(end); {
		next := t.nextEdge(cur)
		if !next.After(cur) { // cannot happen; never loop forever
			next = cur.Add(time.Minute)
		}
		if next.After(end) {
			next = end
		}
		if next.Before(end) {
			if b := t.BandAt(next); b != band {
				add(band, joules*next.Sub(segStart).Seconds()/total)
				band, segStart = b, next
			}
		}
		cur = next
	}
	add(band, joules*end.Sub(segStart).Seconds()/total)
}

// nextEdge is the first instant after cur at which the band may change: the
// next rule edge on the local wall clock, or the next UTC offset change,
// whichever comes first. Until that offset change the offset is constant,
// so wall time converts to an instant without ambiguity.
func (t *Tariff) nextEdge(cur time.Time) time.Time {
	lt := cur.In(t.loc)
	_, offset := lt.Zone()
	wallMidnight := time.Date(lt.Year(), lt.Month(), lt.Day(), 0, 0, 0, 0, time.UTC)
	sinceMidnight := time.Duration(lt.Hour())*time.Hour + time.Duration(lt.Minute())*time.Minute +
		time.Duration(lt.Second())*time.Second + time.Duration(lt.Nanosecond())
	edge := 24 * time.Hour // midnight: the weekday changes
	for _, m := range t.edges {
		if d := time.Duration(m) * time.Minute; d > sinceMidnight {
			edge = d
			break
		}
	}
	next := time.Unix(wallMidnight.Add(edge).Unix()-int64(offset), 0)
	if _, zoneEnd := lt.ZoneBounds(); !zoneEnd.IsZero() && zoneEnd.After(cur) && zoneEnd.Before(next) {
		next = zoneEnd
	}
	return next
}
