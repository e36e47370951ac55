// Package pricewatch fetches GPU offers from a provider on a schedule,
// keeps each GPU model's price history in the store, raises price alerts
// (drops and surges against the trailing average), and answers price
// queries: the PriceService and the cost model's PriceCatalog.
package pricewatch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/trainmeter/trainmeter/collector/internal/alert"
	"github.com/trainmeter/trainmeter/internal/plural"
	"github.com/trainmeter/trainmeter/pkg/clock"
	"github.com/trainmeter/trainmeter/pkg/money"
	"github.com/trainmeter/trainmeter/pkg/prices"

	"github.com/trainmeter/trainmeter/internal/lifecycle"
)

// Store namespaces: "prices" holds the history, key "MODEL/UNIXNANOS" where
// MODEL is the model's key (prices.Key) with "%" and "/" escaped as "%25"
// and "%2F" (so that one model's prefix "MODEL/" is never the start of
// another's: "a100/" is not "a100/80gb/"), and UNIXNANOS has 20 digits (so
// keys sort by time) → prices.ModelPrice JSON with the time;
// "price-offers" holds the latest fetch's offers under "latest", and
// "price-state" each model's alert state (normal, drop, surge).
const (
	NSPrices     = "prices"
	NSOffers     = "price-offers"
	NSPriceState = "price-state"
)

// Retention is how long history is kept (the longest trend is 30 days).
const Retention = 31 * 24 * time.Hour

// Config configures the watcher.
type Config struct {
	// Interval between scheduled fetches (the first at Start); 0: no
	// schedule (fetch on demand).
	Interval time.Duration
	// Rule decides price alerts; zero: prices.DefaultAlertRule.
	Rule prices.AlertRule
	// Clock; nil: the wall clock.
	Clock clock.Clock
}

// Validate checks the config.
func (c Config) Validate() error {
	if c.Interval < 0 {
		return fmt.Errorf("price fetch interval must be >= 0, got %v", c.Interval)
	}
	if c.Rule != (prices.AlertRule{}) {
		return c.Rule.Validate()
	}
	return nil
}

// Store is the part of the collector store the watcher needs.
type Store interface {
	PutRecord(ns, k string, v []byte) error
	PutRecords(ns string, kv map[string][]byte) error
	GetRecord(ns, k string) ([]byte, error)
	DeleteRecord(ns, k string) error
	ScanRecords(ns, keyPrefix string, fn func(k string, v []byte) (bool, error)) error
}

// point is one stored history entry.
type point struct {
	Time time.Time `json:"t"`
	prices.ModelPrice
}

type snapshot struct {
	Provider string         `json:"provider"`
	Time     time.Time      `json:"t"`
	Offers   []prices.Offer `json:"offers"`
}

// Watcher fetches and keeps prices.
type Watcher struct {
	cfg      Config
	provider prices.Provider
	store    Store
	rec      *alert.Recorder
	log      *slog.Logger

	fetchMu sync.Mutex // one fetch at a time

	mu     sync.Mutex
	latest snapshot
	byKey  map[string]prices.ModelPrice
	// match finds a GPU name's model among byKey's keys; resolved
	// remembers its answers ("": no match) until the next fetch.
	match    *prices.Matcher
	resolved map[string]string

	stop chan struct{}
	done chan struct{}
}

// New returns a watcher; provider may be nil (no fetching, history and
// queries only); rec may be nil (no alerts).
func New(cfg Config, provider prices.Provider, st Store, rec *alert.Recorder, log *slog.Logger) *Watcher {
	if cfg.Rule == (prices.AlertRule{}) {
		cfg.Rule = prices.DefaultAlertRule
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	w := &Watcher{cfg: cfg, provider: provider, store: st, rec: rec, log: log, byKey: map[string]prices.ModelPrice{}}
	if b, err := st.GetRecord(NSOffers, "latest"); err == nil {
		var s snapshot
		if json.Unmarshal(b, &s) == nil {
			w.setLatest(s)
		}
	}
	return w
}

func (w *Watcher) setLatest(s snapshot) {
	by := prices.ByModel(s.Offers)
	keys := make([]string, 0, len(by))
	for k := range by {
		keys = append(keys, k)
	}
	m := prices.NewMatcher(keys)
	w.mu.Lock()
	w.latest, w.byKey, w.match, w.resolved = s, by, m, map[string]string{}
	w.mu.Unlock()
}

// maxResolved bounds the remembered GPU names (a few per cluster).
const maxResolved = 1024

// modelKey is the key of the catalog model gpuName denotes (prices.Matcher):
// NVML's "NVIDIA H100 80GB HBM3" is vast.ai's "H100 SXM". Call with mu held.
func (w *Watcher) modelKey(gpuName string) (string, bool) {
	if w.match == nil {
		return "", false
	}
	if k, ok := w.resolved[gpuName]; ok {
		return k, k != ""
	}
	k, _ := w.match.MatchName(gpuName)
	if len(w.resolved) >= maxResolved {
		clear(w.resolved)
	}
	w.resolved[gpuName] = k
	return k, k != ""
}

// Provider names the provider ("" if none).
func (w *Watcher) Provider() string {
	if w.provider == nil {
		return ""
	}
	return w.provider.Name()
}

// Start fetches on the schedule until Shutdown (nothing without a provider
// or an interval): once at once (in the background, so that a slow
// provider does not hold up the collector's start), then every interval.
func (w *Watcher) Start(context.Context) error {
	if w.provider == nil || w.cfg.Interval <= 0 {
		return nil
	}
	stop, done := make(chan struct{}), make(chan struct{})
	w.stop, w.done = stop, done
	t := w.cfg.Clock.NewTicker(w.cfg.Interval)
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		defer close(done)
		defer t.Stop()
		defer cancel()
		go func() { // cancels a fetch in flight when stopped
			select {
			case <-stop:
				cancel()
			case <-ctx.Done():
			}
		}()
		fetch := func() {
			if _, err := w.Fetch(ctx); err != nil && ctx.Err() == nil {
				w.log.Warn("scheduled price fetch failed", "provider", w.provider.Name(), "err", err)
			}
		}
		fetch()
		for {
			select {
			case <-stop:
				return
			case <-t.C():
				fetch()
			}
		}
	}()
	return nil
}

// Shutdown stops the schedule (an ongoing fetch is cancelled) and waits
// for it until ctx ends.
func (w *Watcher) Shutdown(ctx context.Context) error {
	if w.stop == nil {
		return nil
	}
	close(w.stop)
	w.stop = nil
	return lifecycle.Wait(ctx, w.done, "price watcher")
}

// FetchResult says what a fetch did.
type FetchResult struct {
	Offers, Models, Alerts int
}

// ErrNoProvider: the collector has no price provider configured.
var ErrNoProvider = errors.New("no price provider configured: start the collector with `trainmeter serve --price-provider vastai` " +
	"(API key in $TRAINMETER_VASTAI_KEY or --vastai-key-file) or `--price-provider file --price-file FILE`, " +
	"or load a price list now with `trainmeter prices import FILE`")

// Fetch gets offers now, records each model's price point, and fires the
// price alerts due.
func (w *Watcher) Fetch(ctx context.Context) (FetchResult, error) {
	if w.provider == nil {
		return FetchResult{}, ErrNoProvider
	}
	w.fetchMu.Lock()
	defer w.fetchMu.Unlock()
	offers, err := w.provider.Offers(ctx)
	if err != nil {
		return FetchResult{}, err
	}
	if len(offers) == 0 {
		// Keep the last prices rather than record an empty market.
		return FetchResult{}, fmt.Errorf("%s returned no offers", w.provider.Name())
	}
	now := w.cfg.Clock.Now().UTC()
	return w.Record(ctx, now, offers)
}

// Import records offers from elsewhere (a price list sent by the CLI) as a
// fetch at the clock's now.
func (w *Watcher) Import(ctx context.Context, offers []prices.Offer) (FetchResult, error) {
	w.fetchMu.Lock()
	defer w.fetchMu.Unlock()
	return w.Record(ctx, w.cfg.Clock.Now().UTC(), offers)
}

// Record stores one fetch's offers taken at now (Fetch calls it; tests
// call it to feed a series).
func (w *Watcher) Record(ctx context.Context, now time.Time, offers []prices.Offer) (FetchResult, error) {
	by := prices.ByModel(offers)
	res := FetchResult{Offers: len(offers), Models: len(by)}
	snap := snapshot{Provider: w.Provider(), Time: now, Offers: offers}
	b, err := json.Marshal(snap)
	if err != nil {
		return res, err
	}
	if err := w.store.PutRecord(NSOffers, "latest", b); err != nil {
		return res, err
	}
	keys := make([]string, 0, len(by))
	for k := range by {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var errs []error
	for _, k := range keys {
		mp := by[k]
		hist, err := w.history(k, now.Add(-Retention))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		p := prices.Point{Time: now, USD: mp.Median}
		prev := prices.StateNormal
		if b, err := w.store.GetRecord(NSPriceState, k); err == nil {
			prev = string(b)
		}
		c := w.cfg.Rule.Check(toPoints(hist), p, prev)
		pb, _ := json.Marshal(point{Time: now, ModelPrice: mp})
		if err := w.store.PutRecord(NSPrices, histKey(k, now), pb); err != nil {
			errs = append(errs, err)
			continue
		}
		if c.State != prev {
			_ = w.store.PutRecord(NSPriceState, k, []byte(c.State))
		}
		if c.Fire && w.rec != nil {
			if fired, err := w.fire(ctx, k, mp, c, now); err != nil {
				errs = append(errs, err)
			} else if fired {
				res.Alerts++
			}
		}
		w.prune(k, now.Add(-Retention))
	}
	w.setLatest(snap)
	return res, errors.Join(errs...)
}

func (w *Watcher) fire(ctx context.Context, k string, mp prices.ModelPrice, c prices.Change, now time.Time) (bool, error) {
	sev, what := alert.SeverityInfo, "dropped"
	if c.State == prices.StateSurge {
		sev, what = alert.SeverityWarning, "surged"
	}
	a := alert.Alert{
		Kind: alert.KindPrice, Severity: sev, Scope: mp.GPUName, Threshold: c.Change, Time: now,
		GPUName: mp.GPUName, PriceUSDPerHour: mp.Median, ReferenceUSDPerHour: c.Reference, Change: c.Change,
		Message: fmt.Sprintf("%s price %s %+.1f%%: median %s/GPU-h vs %s trailing %s average (cheapest %s, %s)",
			mp.GPUName, what, 100*c.Change, money.Rate(mp.Median), money.Rate(c.Reference), windowLabel(w.cfg.Rule.Window), money.Rate(mp.Cheapest), plural.N(mp.Offers, "offer")),
	}
	return w.rec.Fire(ctx, fmt.Sprintf("%s/%s/%020d", alert.KindPrice, k, now.UnixNano()), a)
}

var histEscaper = strings.NewReplacer("%", "%25", "/", "%2F")

// histPrefix is the key prefix of model k's history.
func histPrefix(k string) string { return histEscaper.Replace(k) + "/" }

// windowLabel writes a window for people: "24 h", "90 min".
func windowLabel(d time.Duration) string {
	switch {
	case d > 0 && d%time.Hour == 0:
		return fmt.Sprintf("%d h", d/time.Hour)
	case d > 0 && d%time.Minute == 0:
		return fmt.Sprintf("%d min", d/time.Minute)
	}
	return d.String()
}

func histKey(k string, t time.Time) string {
	return fmt.Sprintf("%s%020d", histPrefix(k), t.UnixNano())
}

// histPrefixes are the prefixes model k's history is stored under: the
// escaped one, and for a key that escaping changes the unescaped one of
// versions before the escaping (their points expire with Retention).
func histPrefixes(k string) []string {
	if p := histPrefix(k); p != k+"/" {
		return []string{p, k + "/"}
	}
	return []string{k + "/"}
}

// isHistTime says whether what follows a history prefix is a time (20
// digits) rather than the rest of a longer model's unescaped key.
func isHistTime(s string) bool {
	if len(s) != 20 {
		return false
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// scanHistory calls fn with each stored point of model k, per prefix in
// time order.
func (w *Watcher) scanHistory(k string, fn func(key string, p point, ok bool) bool) error {
	for _, prefix := range histPrefixes(k) {
		err := w.store.ScanRecords(NSPrices, prefix, func(key string, v []byte) (bool, error) {
			if !isHistTime(key[len(prefix):]) {
				return true, nil // another model's point (unescaped, before versions that escape)
			}
			var p point
			ok := json.Unmarshal(v, &p) == nil
			return fn(key, p, ok), nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

func (w *Watcher) history(k string, since time.Time) ([]point, error) {
	var out []point
	err := w.scanHistory(k, func(_ string, p point, ok bool) bool {
		if ok && !p.Time.Before(since) {
			out = append(out, p)
		}
		return true
	})
	sort.SliceStable(out, func(i, j int) bool { return out[i].Time.Before(out[j].Time) })
	return out, err
}

func (w *Watcher) prune(k string, before time.Time) {
	var old []string
	_ = w.scanHistory(k, func(key string, p point, ok bool) bool {
		if ok && p.Time.Before(before) {
			old = append(old, key)
			return true
		}
		return !ok // sorted by time: the rest is newer
	})
	for _, key := range old {
		_ = w.store.DeleteRecord(NSPrices, key)
	}
}

func toPoints(h []point) []prices.Point {
	out := make([]prices.Point, len(h))
	for i, p := range h {
		out[i] = prices.Point{Time: p.Time, USD: p.Median}
	}
	return out
}

// CurrentPrice is the cheapest current per-GPU $/h for a GPU model, found
// by prices.Matcher (NVML's "NVIDIA H100 80GB HBM3" is priced as vast.ai's
// "H100 SXM"); the cost model's PriceCatalog.
func (w *Watcher) CurrentPrice(gpuName string) (float64, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	k, ok := w.modelKey(gpuName)
	if !ok {
		return 0, false
	}
	return w.byKey[k].Cheapest, true
}

// Windows are the trend windows shown.
var Windows = []struct {
	Name string
	D    time.Duration
}{{"24h", 24 * time.Hour}, {"7d", 7 * 24 * time.Hour}, {"30d", 30 * 24 * time.Hour}}

// ModelView is what is shown for one GPU model.
type ModelView struct {
	prices.ModelPrice
	Fetched     time.Time
	Trends      map[string]prices.Trend
	Recommended []prices.Scored
}

// View returns the latest prices of every model (gpu empty) or one model
// (found by prices.Matcher, with recommendations), with trends over 24 h, 7 d and 30 d of the
// median price.
func (w *Watcher) View(gpu string, recommend int) ([]ModelView, error) {
	w.mu.Lock()
	latest, by := w.latest, w.byKey
	k, found := w.modelKey(gpu)
	w.mu.Unlock()
	var keys []string
	if gpu != "" {
		if !found {
			return nil, fmt.Errorf("no offers for GPU %q in the latest fetch", gpu)
		}
		keys = []string{k}
	} else {
		for k := range by {
			keys = append(keys, k)
		}
		sort.Strings(keys)
	}
	now := w.cfg.Clock.Now()
	var out []ModelView
	for _, k := range keys {
		hist, err := w.history(k, now.Add(-Retention))
		if err != nil {
			return nil, err
		}
		pts := toPoints(hist)
		v := ModelView{ModelPrice: by[k], Fetched: latest.Time, Trends: map[string]prices.Trend{}}
		for _, win := range Windows {
			v.Trends[win.Name] = prices.TrendOver(pts, now, win.D)
		}
		if gpu != "" && recommend > 0 {
			rec := prices.Recommend(latest.Offers, k, prices.DefaultWeights, 0)
			v.Recommended = rec[:min(recommend, len(rec))]
		}
		out = append(out, v)
	}
	return out, nil
}
