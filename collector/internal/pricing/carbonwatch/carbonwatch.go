// Package carbonwatch is the collector's live carbon-intensity source: it
// fetches each configured zone's grid intensity by the hour from an
// ElectricityMaps-shaped API on a schedule, keeps it in memory and in the
// store, and books a run's energy to the intensity of each hour it was
// consumed in (cost.CarbonSource). Collectors sharing a store fetch once
// for the fleet: the leader fetches and stores the hours, the others
// Reload them, so every collector books the same intensity for an hour.
// docs/costs.md, "Live carbon intensity".
package carbonwatch

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/trainmeter/trainmeter/collector/internal/pricing/cost"
	"github.com/trainmeter/trainmeter/collector/internal/storage"
	"github.com/trainmeter/trainmeter/internal/httpretry"
	"github.com/trainmeter/trainmeter/internal/lifecycle"
	"github.com/trainmeter/trainmeter/pkg/clock"
)

// DefaultBaseURL is ElectricityMaps' API.
const DefaultBaseURL = "https://api.electricitymap.org"

// Defaults of Config.
const (
	DefaultInterval = 15 * time.Minute
	// DefaultCarry: an hour the source has not published yet (the first
	// minutes after the hour, or a fetch that failed) takes the latest
	// published hour's intensity, if it is at most this much older; the
	// grid's intensity moves little from one hour to the next, much less
	// than from a real hour to the flat yearly average.
	DefaultCarry = 2 * time.Hour
	// Retention: hours are kept as long as ingest accepts a window
	// (ingest.MaxBatchAge, 30 days) and a day more.
	Retention   = 31 * 24 * time.Hour
	maxAttempts = 4
	maxBackoff  = time.Minute
	maxBody     = 4 << 20
)

// NSCarbon is the store namespace of the fetched hours: key the zone →
// zoneRecord JSON. The leader is its only writer.
const NSCarbon = "carbon"

// zoneRecord is one zone's hours as stored.
type zoneRecord struct {
	// Fetched is when the fetch that last added hours ran.
	Fetched time.Time `json:"fetched"`
	// Hours: Unix hour start (s) → gCO2/kWh, the source's intensity.
	Hours map[int64]float64 `json:"hours"`
}

// Config configures the watcher.
type Config struct {
	// BaseURL of the API ("" = no live source; "default" is not a value:
	// give DefaultBaseURL).
	BaseURL string
	Token   string   // sent in the auth-token header ("" = none)
	Zones   []string // fetched each on its own
	// Interval between fetches (the first at Start); 0: DefaultInterval.
	Interval time.Duration
	Carry    time.Duration // 0: DefaultCarry
	Client   *http.Client  // nil: one with a 30 s timeout
	// Clock of the schedule and the retry backoff; nil: the wall clock.
	Clock clock.Clock
}

// Enabled says whether a live source is configured.
func (c Config) Enabled() bool { return c.BaseURL != "" }

// Validate checks the config.
func (c Config) Validate() error {
	if !c.Enabled() {
		return nil
	}
	var errs []error
	u, err := url.Parse(c.BaseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		errs = append(errs, fmt.Errorf("carbon api %q: want an http(s) URL like %s", c.BaseURL, DefaultBaseURL))
	}
	if len(c.Zones) == 0 {
		errs = append(errs, errors.New("carbon api: no zone to ask for (give --carbon-zone or --carbon-node-zone)"))
	}
	for _, z := range c.Zones {
		if err := cost.ValidZoneName(z); err != nil {
			errs = append(errs, fmt.Errorf("carbon api: %w", err))
		}
	}
	if c.Interval < 0 || c.Carry < 0 {
		errs = append(errs, fmt.Errorf("carbon api: interval %v and carry %v must be >= 0", c.Interval, c.Carry))
	}
	return errors.Join(errs...)
}

// Watcher fetches and keeps the intensities. It is a cost.CarbonSource.
type Watcher struct {
	cfg Config
	log *slog.Logger

	store storage.Records // nil: the hours live in memory only

	mu    sync.RWMutex
	hours map[string]map[int64]float64 // zone → Unix hour start (s) → gCO2/kWh
	// version counts the fetches that changed hours, so that a Reload
	// that read the store before one does not undo it.
	version  uint64
	stats    Stats
	schedule *lifecycle.Periodic
	sleepFn  func(ctx context.Context, d time.Duration) error
}

// Stats says what the fetches did (the collector's GET /status "carbon").
type Stats struct {
	// Fetches and Failures count zone fetches (history and latest).
	Fetches  int `json:"fetches"`
	Failures int `json:"failures"`
	// Skipped counts entries of otherwise good answers left out: another
	// zone, no or a bad intensity, a bad datetime.
	Skipped   int                  `json:"skipped"`
	LastError string               `json:"last_error"` // "" after a success
	Zones     map[string]ZoneStats `json:"zones"`
}

// ZoneStats is what is known of one zone: its hours and the newest.
type ZoneStats struct {
	Hours  int       `json:"hours"`
	Newest time.Time `json:"newest"`
}

// New returns a watcher; nothing is fetched before Start or Fetch.
func New(cfg Config, log *slog.Logger) *Watcher {
	log = cmp.Or(log, slog.New(slog.DiscardHandler))
	cfg.Interval = cmp.Or(cfg.Interval, DefaultInterval)
	cfg.Carry = cmp.Or(cfg.Carry, DefaultCarry)
	cfg.Clock = cmp.Or[clock.Clock](cfg.Clock, clock.Real{})
	cfg.Client = cmp.Or(cfg.Client, &http.Client{Timeout: 30 * time.Second})
	w := &Watcher{cfg: cfg, log: log, hours: map[string]map[int64]float64{}, schedule: lifecycle.NewPeriodic("carbon watcher")}
	w.sleepFn = func(ctx context.Context, d time.Duration) error {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-w.cfg.Clock.After(d):
			return nil
		}
	}
	return w
}

// SetStore keeps the hours in st from now on: Fetch merges what it gets
// into the stored hours and writes them back, Reload reads them. It
// reloads at once (before the store serves ingest, so that the first
// windows stored are booked at the stored hours).
func (w *Watcher) SetStore(st storage.Records) error {
	w.store = st
	return w.Reload()
}

// Reload reads every zone's hours from the store: the collectors of a
// fleet that do not fetch (package leader) book the leader's fetches this
// way. A zone not stored yet keeps what it has.
func (w *Watcher) Reload() error {
	if w.store == nil {
		return nil
	}
	w.mu.RLock()
	v := w.version
	w.mu.RUnlock()
	got := map[string]map[int64]float64{}
	var errs []error
	for _, z := range w.cfg.Zones {
		rec, ok, err := w.stored(z)
		if err != nil {
			errs = append(errs, err)
		} else if ok {
			got[z] = rec.Hours
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.version == v { // else a fetch stored newer hours meanwhile
		maps.Copy(w.hours, got)
	}
	return errors.Join(errs...)
}

// stored reads zone's record; false when there is none.
func (w *Watcher) stored(zone string) (zoneRecord, bool, error) {
	b, err := w.store.GetRecord(NSCarbon, zone)
	if errors.Is(err, storage.ErrNotFound) {
		return zoneRecord{}, false, nil
	}
	var rec zoneRecord
	if err == nil {
		err = json.Unmarshal(b, &rec)
	}
	if err != nil {
		return zoneRecord{}, false, fmt.Errorf("zone %s: stored hours: %w", zone, err)
	}
	if rec.Hours == nil {
		rec.Hours = map[int64]float64{}
	}
	return rec, true, nil
}

// Start fetches every zone at once (in the background: a slow API does not
// hold up the collector's start), then every Interval, until Shutdown.
func (w *Watcher) Start(context.Context) error {
	if !w.cfg.Enabled() {
		return nil
	}
	w.schedule.Start(w.cfg.Clock, w.cfg.Interval, func(ctx context.Context) {
		if err := w.Fetch(ctx); err != nil && ctx.Err() == nil {
			w.log.Warn("carbon intensity fetch failed; hours it does not cover take the last intensity up to "+w.cfg.Carry.String()+" old, else --grid-gco2-kwh", "err", err)
		}
	})
	return nil
}

// Shutdown stops the schedule (a fetch in flight is cancelled) and waits
// for it until ctx ends.
func (w *Watcher) Shutdown(ctx context.Context) error {
	return w.schedule.Shutdown(ctx)
}

// Stats returns what the fetches did so far.
func (w *Watcher) Stats() Stats {
	w.mu.RLock()
	defer w.mu.RUnlock()
	st := w.stats
	st.Zones = map[string]ZoneStats{}
	for _, z := range w.cfg.Zones {
		zs := ZoneStats{Hours: len(w.hours[z])}
		if zs.Hours > 0 {
			zs.Newest = time.Unix(slices.Max(slices.Collect(maps.Keys(w.hours[z]))), 0).UTC()
		}
		st.Zones[z] = zs
	}
	return st
}

// Fetch asks for every zone's history (the last 24 hours) and latest
// intensity now. A zone whose answer fails keeps what was fetched before;
// the other zones are still asked. The error joins every zone's.
func (w *Watcher) Fetch(ctx context.Context) error {
	var errs []error
	for _, z := range w.cfg.Zones {
		var got []point
		var skipped int
		failed := false
		for _, path := range []string{"/v3/carbon-intensity/history", "/v3/carbon-intensity/latest"} {
			pts, sk, err := w.get(ctx, path, z)
			if err != nil {
				errs = append(errs, fmt.Errorf("zone %s: %w", z, err))
				got, failed = nil, true
				break
			}
			got, skipped = append(got, pts...), skipped+sk
		}
		if err := w.keep(z, got); err != nil {
			errs = append(errs, err)
		}
		w.mu.Lock()
		w.stats.Fetches++
		w.stats.Skipped += skipped
		if failed {
			w.stats.Failures++
		}
		w.mu.Unlock()
	}
	err := errors.Join(errs...)
	w.mu.Lock()
	defer w.mu.Unlock()
	w.stats.LastError = ""
	if err != nil {
		w.stats.LastError = err.Error()
	}
	return err
}

// keep merges zone's fetched points into its hours (the stored ones when
// the watcher has a store: a collector that has just taken over the fetches
// adds to what the leader before it stored), drops those past Retention,
// and stores the result.
func (w *Watcher) keep(zone string, got []point) error {
	w.mu.RLock()
	m := maps.Clone(w.hours[zone])
	w.mu.RUnlock()
	if m == nil {
		m = map[int64]float64{}
	}
	var err error
	if w.store != nil {
		var rec zoneRecord
		var ok bool
		if rec, ok, err = w.stored(zone); ok {
			m = rec.Hours
		}
	}
	for _, p := range got {
		m[p.hour] = p.g
	}
	now := w.cfg.Clock.Now()
	oldest := now.Add(-Retention).Unix()
	maps.DeleteFunc(m, func(h int64, _ float64) bool { return h < oldest })
	// A store that could not be read is not written: what it holds may be
	// newer than this collector's memory.
	if w.store != nil && err == nil && len(got) > 0 {
		b, merr := json.Marshal(zoneRecord{Fetched: now.UTC(), Hours: m})
		if err = merr; err == nil {
			if err = w.store.PutRecord(NSCarbon, zone, b); err != nil {
				err = fmt.Errorf("zone %s: storing hours: %w", zone, err)
			}
		}
	}
	w.mu.Lock()
	w.hours[zone] = m
	w.version++
	w.mu.Unlock()
	return err
}

type point struct {
	hour int64
	g    float64
}

// get fetches one endpoint for zone, retrying HTTP 429, 5xx and transport
// errors with capped exponential backoff and jitter (at least what
// Retry-After asks, in seconds, up to the cap).
func (w *Watcher) get(ctx context.Context, path, zone string) ([]point, int, error) {
	u := strings.TrimRight(w.cfg.BaseURL, "/") + path + "?zone=" + url.QueryEscape(zone)
	var pts []point
	var skipped int
	err := httpretry.Do(ctx, u, httpretry.Policy{Attempts: maxAttempts, MaxBackoff: maxBackoff, MaxRetryAfter: maxBackoff, Sleep: w.sleepFn},
		func(ctx context.Context) (retryAfter time.Duration, retryable bool, err error) {
			pts, skipped, retryAfter, err = w.getOnce(ctx, u, zone)
			var he *httpretry.HTTPError
			var bad *BadAnswerError
			retryable = (!errors.As(err, &he) || he.Status == http.StatusTooManyRequests || he.Status >= 500) && !errors.As(err, &bad)
			return retryAfter, retryable, err
		})
	return pts, skipped, err // getOnce gives no points with an error
}

// BadAnswerError: the API answered 2xx with something that is not its
// documented shape (not retried: asking again gives the same).
type BadAnswerError struct{ Reason string }

func (e *BadAnswerError) Error() string { return "malformed answer: " + e.Reason }

// entry is one intensity of the API's answers: /latest is one, /history
// a list of them under "history".
type entry struct {
	Zone            string   `json:"zone"`
	CarbonIntensity *float64 `json:"carbonIntensity"`
	Datetime        string   `json:"datetime"`
	UpdatedAt       string   `json:"updatedAt"`
}

func (w *Watcher) getOnce(ctx context.Context, u, zone string) ([]point, int, time.Duration, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, 0, 0, err
	}
	req.Header.Set("Accept", "application/json")
	if w.cfg.Token != "" {
		req.Header.Set("auth-token", w.cfg.Token)
	}
	resp, err := w.cfg.Client.Do(req)
	if err != nil {
		return nil, 0, 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		var ra time.Duration
		if s, err := strconv.Atoi(strings.TrimSpace(resp.Header.Get("Retry-After"))); err == nil && s > 0 {
			ra = time.Duration(s) * time.Second
		}
		return nil, 0, ra, &httpretry.HTTPError{Status: resp.StatusCode, Body: strings.TrimSpace(string(body))}
	}
	pts, skipped, err := parseAnswer(io.LimitReader(resp.Body, maxBody), zone)
	return pts, skipped, 0, err
}

// parseAnswer reads an answer of /latest (one intensity) or /history
// (under "history") for zone: the intensities it holds and how many
// entries it skipped; a BadAnswerError for anything else.
func parseAnswer(r io.Reader, zone string) ([]point, int, error) {
	var body struct {
		entry
		History *[]json.RawMessage `json:"history"`
	}
	if err := json.NewDecoder(r).Decode(&body); err != nil {
		return nil, 0, &BadAnswerError{Reason: err.Error()}
	}
	if body.Zone != "" && body.Zone != zone {
		return nil, 0, &BadAnswerError{Reason: fmt.Sprintf("asked for zone %s, got %s", zone, body.Zone)}
	}
	var raw []json.RawMessage
	switch {
	case body.History != nil:
		raw = *body.History
	case body.CarbonIntensity != nil || body.Datetime != "":
		one, _ := json.Marshal(body.entry)
		raw = []json.RawMessage{one}
	default:
		return nil, 0, &BadAnswerError{Reason: "neither carbonIntensity nor history"}
	}
	var pts []point
	skipped := 0
	for _, r := range raw {
		if p, ok := parseEntry(r, zone); ok {
			pts = append(pts, p)
		} else {
			skipped++
		}
	}
	return pts, skipped, nil
}

// parseEntry reads one intensity; an entry of another zone, without an
// intensity (the API gives null for hours it has no data for), with a
// negative or non-finite one, or without a valid datetime is skipped.
func parseEntry(r json.RawMessage, zone string) (point, bool) {
	var e entry
	if err := json.Unmarshal(r, &e); err != nil || (e.Zone != "" && e.Zone != zone) || e.CarbonIntensity == nil {
		return point{}, false
	}
	g := *e.CarbonIntensity
	t, err := time.Parse(time.RFC3339Nano, e.Datetime)
	if err != nil || math.IsNaN(g) || math.IsInf(g, 0) || g < 0 {
		return point{}, false
	}
	return point{hour: t.Truncate(time.Hour).Unix(), g: g}, true
}

// lookup is zone's intensity in the hour starting at hour (Unix s): the
// hour's own, else the latest earlier hour's up to Carry older; false when
// none. Call with mu held.
func (w *Watcher) lookup(zone string, hour int64) (float64, bool) {
	m := w.hours[zone]
	if g, ok := m[hour]; ok {
		return g, true
	}
	for back := int64(3600); back <= int64(w.cfg.Carry/time.Second); back += 3600 {
		if g, ok := m[hour-back]; ok {
			return g, true
		}
	}
	return 0, false
}

// SplitCarbon implements cost.CarbonSource: joules over [start, end) are
// split at hour boundaries in proportion to time, each hour's part at that
// hour's intensity.
func (w *Watcher) SplitCarbon(zone string, start, end time.Time, joules float64,
	add func(float64, string, float64), missing func(time.Time, time.Time, float64)) {
	w.mu.RLock()
	defer w.mu.RUnlock()
	if !end.After(start) {
		if g, ok := w.lookup(zone, start.Truncate(time.Hour).Unix()); ok {
			add(g, cost.CarbonSourceLive, joules)
		} else {
			missing(start, end, joules)
		}
		return
	}
	total := end.Sub(start).Seconds()
	for cur := start; cur.Before(end); {
		h := cur.Truncate(time.Hour)
		next := h.Add(time.Hour)
		if next.After(end) {
			next = end
		}
		j := joules * next.Sub(cur).Seconds() / total
		if g, ok := w.lookup(zone, h.Unix()); ok {
			add(g, cost.CarbonSourceLive, j)
		} else {
			missing(cur, next, j)
		}
		cur = next
	}
}
