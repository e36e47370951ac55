// Package pricewatch fetches GPU offers from one or several providers on a
// schedule, keeps each provider's last good catalog and each GPU model's
// price history (over all providers, with a per-provider breakdown) in the
// store, raises price alerts (drops and surges against the trailing
// average), and answers price queries: the PriceService and the cost
// model's PriceCatalog.
package pricewatch

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/trainmeter/trainmeter/collector/internal/alert"
	"github.com/trainmeter/trainmeter/collector/internal/pricing/prices"
	"github.com/trainmeter/trainmeter/collector/internal/storage"
	"github.com/trainmeter/trainmeter/internal/money"
	"github.com/trainmeter/trainmeter/internal/plural"
	"github.com/trainmeter/trainmeter/pkg/clock"

	"github.com/trainmeter/trainmeter/internal/lifecycle"
)

// Store namespaces: "prices" holds the history, key "MODEL/UNIXNANOS" where
// MODEL is the model's key (prices.Key) with "%" and "/" escaped as "%25"
// and "%2F" (so that one model's prefix "MODEL/" is never the start of
// another's: "a100/" is not "a100/80gb/"), and UNIXNANOS has 20 digits (so
// keys sort by time) → prices.ModelPrice JSON with the time;
// "price-offers" holds every provider's last good catalog under "catalogs",
// and "price-state" each model's alert state (normal, drop, surge).
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
	Clock    clock.Clock // nil: the wall clock
	// MaxOfferAge: a fetched catalog whose last good answer is older is
	// stale: still listed, but no current price; 0:
	// DefaultMaxOfferAge(Interval).
	MaxOfferAge time.Duration
}

// MinDefaultMaxOfferAge is the floor of DefaultMaxOfferAge: GPU rental
// prices move over days, the shortest trend and the alert window are 24 h,
// and a provider's maintenance or rate-limit of a few hours should not
// flip run costs between market and configured prices; a day-old answer
// is no longer what anyone calls today's price.
const MinDefaultMaxOfferAge = 24 * time.Hour

// DefaultMaxOfferAge is the max offer age when none is configured: three
// fetch intervals (two scheduled fetches in a row may fail before a
// catalog goes stale), at least MinDefaultMaxOfferAge.
func DefaultMaxOfferAge(interval time.Duration) time.Duration {
	return max(MinDefaultMaxOfferAge, 3*interval)
}

// ValidateSchedule checks a fetch interval and a max offer age (0: the
// default) together: a max age no longer than the interval would make
// every catalog stale before its next scheduled fetch.
func ValidateSchedule(interval, maxOfferAge time.Duration) error {
	var errs []error
	if interval < 0 {
		errs = append(errs, fmt.Errorf("price fetch interval must be >= 0, got %v", interval))
	}
	if maxOfferAge < 0 {
		errs = append(errs, fmt.Errorf("price max offer age (--price-max-age) must be >= 0 (0: max(%v, 3 × the fetch interval)), got %v", MinDefaultMaxOfferAge, maxOfferAge))
	}
	if maxOfferAge > 0 && interval > 0 && maxOfferAge <= interval {
		errs = append(errs, fmt.Errorf("price max offer age (--price-max-age) %v must be longer than the fetch interval (--price-fetch-interval) %v: every catalog would be stale before its next fetch", maxOfferAge, interval))
	}
	return errors.Join(errs...)
}

type point struct {
	Time time.Time `json:"t"`
	prices.ModelPrice
}

// catalog is one provider's last good answer and how its latest fetch
// went.
type catalog struct {
	Provider string         `json:"provider"`
	Time     time.Time      `json:"t"` // of the answer the offers come from
	Offers   []prices.Offer `json:"offers"`
	Skipped  int            `json:"skipped,omitempty"` // entries of that answer not priced
	// Imported: recorded by `trainmeter prices import` (Import), not fetched.
	Imported bool `json:"imported,omitempty"`
	// LastError of the latest fetch, when it failed (the offers are then
	// the last good answer's), and when.
	LastError     string    `json:"last_error,omitempty"`
	LastErrorTime time.Time `json:"last_error_t,omitzero"`
}

// expires is when the catalog stops counting as current (zero: never: an
// imported list is the user's own data, replaced only by another import,
// and a provider never fetched has no offers to age).
func (c catalog) expires(maxAge time.Duration) time.Time {
	if c.Imported || c.Time.IsZero() {
		return time.Time{}
	}
	return c.Time.Add(maxAge)
}

func (c catalog) staleAt(now time.Time, maxAge time.Duration) bool {
	exp := c.expires(maxAge)
	return !exp.IsZero() && now.After(exp)
}

// snapshot is every provider's catalog, as of the latest fetch or import.
type snapshot struct {
	Time     time.Time `json:"t"`
	Catalogs []catalog `json:"catalogs"`
}

// currentOffers are the offers of every catalog not stale at now.
func (s snapshot) currentOffers(now time.Time, maxAge time.Duration) []prices.Offer {
	var out []prices.Offer
	for _, c := range s.Catalogs {
		if !c.staleAt(now, maxAge) {
			out = append(out, c.Offers...)
		}
	}
	return out
}

func (c catalog) result(now time.Time, maxAge time.Duration) ProviderResult {
	r := ProviderResult{Provider: c.Provider, Offers: len(c.Offers), Skipped: c.Skipped, Fetched: c.Time, Err: c.LastError, Stale: c.staleAt(now, maxAge),
		Imported: c.Imported, ErrTime: c.LastErrorTime}
	if !c.Time.IsZero() {
		r.Age = max(0, now.Sub(c.Time))
	}
	return r
}

func (s snapshot) catalog(provider string) (catalog, bool) {
	for _, c := range s.Catalogs {
		if c.Provider == provider {
			return c, true
		}
	}
	return catalog{}, false
}

type Watcher struct {
	cfg       Config
	providers []prices.Provider
	store     storage.Records
	rec       *alert.Recorder
	log       *slog.Logger

	fetchMu sync.Mutex // one fetch at a time

	mu     sync.Mutex
	latest snapshot
	// all is latest's current offers (of the catalogs not stale), byKey
	// their prices by model.
	all   []prices.Offer
	byKey map[string]prices.ModelPrice
	// match finds a GPU name's model among byKey's keys; resolved
	// remembers its answers ("": no match) until the next fetch.
	match    *prices.Matcher
	resolved map[string]string
	// nextStale is when the next current catalog goes stale (zero:
	// none will), so that all and byKey are rebuilt then, not per query;
	// stale names the catalogs with offers judged stale, and allStale
	// says none with offers is current (both to log the changes once).
	nextStale time.Time
	stale     map[string]bool
	allStale  bool

	schedule *lifecycle.Periodic
}

// New returns a watcher over the providers (fetched together, each
// keeping its last good catalog); none: no fetching, history, imports and
// queries only. rec may be nil (no alerts).
func New(cfg Config, providers []prices.Provider, st storage.Records, rec *alert.Recorder, log *slog.Logger) *Watcher {
	cfg.Clock = cmp.Or[clock.Clock](cfg.Clock, clock.Real{})
	if cfg.MaxOfferAge <= 0 {
		cfg.MaxOfferAge = DefaultMaxOfferAge(cfg.Interval)
	}
	log = cmp.Or(log, slog.New(slog.DiscardHandler))
	w := &Watcher{cfg: cfg, providers: providers, store: st, rec: rec, log: log, byKey: map[string]prices.ModelPrice{}, schedule: lifecycle.NewPeriodic("price watcher")}
	w.Reload()
	return w
}

// Reload reads the catalogs from the store again: the collectors of a
// fleet that do not fetch (package leader) take the leader's fetches and
// any collector's imports this way.
func (w *Watcher) Reload() {
	if b, err := w.store.GetRecord(NSOffers, "catalogs"); err == nil {
		var s snapshot
		if json.Unmarshal(b, &s) == nil {
			w.setLatest(s)
		}
	}
}

func (w *Watcher) latestSnapshot() snapshot {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.latest
}

func (w *Watcher) setLatest(s snapshot) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.latest = s
	w.rebuild(w.cfg.Clock.Now())
}

// rebuild sets the current offers from latest's catalogs not stale at now
// and logs the catalogs that went stale since the last rebuild. Call with
// mu held.
func (w *Watcher) rebuild(now time.Time) {
	maxAge := w.cfg.MaxOfferAge
	all := w.latest.currentOffers(now, maxAge)
	var next time.Time
	stale := map[string]bool{}
	for _, c := range w.latest.Catalogs {
		if c.staleAt(now, maxAge) {
			if len(c.Offers) > 0 {
				stale[c.Provider] = true
				if !w.stale[c.Provider] {
					w.log.Warn("price catalog is stale: its offers no longer count as current prices", "provider", c.Provider,
						"fetched", c.Time, "age", now.Sub(c.Time).Round(time.Second), "max_age", maxAge, "last_error", c.LastError)
				}
			}
		} else if exp := c.expires(maxAge); !exp.IsZero() && (next.IsZero() || exp.Before(next)) {
			next = exp
		}
	}
	allStale := len(stale) > 0 && len(all) == 0
	if allStale && !w.allStale {
		w.log.Warn(allStaleWarning(maxAge))
	}
	by := prices.ByModel(all)
	w.all, w.byKey, w.match, w.resolved = all, by, prices.NewMatcher(slices.Collect(maps.Keys(by))), map[string]string{}
	w.nextStale, w.stale, w.allStale = next, stale, allStale
}

// refresh rebuilds the current offers when a catalog has gone stale
// since the last rebuild. Call with mu held.
func (w *Watcher) refresh() time.Time {
	now := w.cfg.Clock.Now()
	if !w.nextStale.IsZero() && now.After(w.nextStale) {
		w.rebuild(now)
	}
	return now
}

func allStaleWarning(maxAge time.Duration) string {
	return fmt.Sprintf("every price catalog is stale (its last good answer is older than the max offer age, %v): there is no current GPU price, "+
		"so runs are priced as without a catalog (run_start, node, owned hardware, then --gpu-price-per-hour) until a fetch succeeds", maxAge)
}

// StaleWarning says that every catalog with offers is stale ("" when one
// is current, or none has offers).
func (w *Watcher) StaleWarning() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.refresh()
	if !w.allStale {
		return ""
	}
	return allStaleWarning(w.cfg.MaxOfferAge)
}

func (w *Watcher) MaxOfferAge() time.Duration { return w.cfg.MaxOfferAge }

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

// Provider names the configured providers, comma-separated ("" if none).
func (w *Watcher) Provider() string {
	names := make([]string, len(w.providers))
	for i, p := range w.providers {
		names[i] = p.Name()
	}
	return strings.Join(names, ",")
}

// Start fetches on the schedule until Shutdown (nothing without a provider
// or an interval): once at once (in the background, so that a slow
// provider does not hold up the collector's start), then every interval.
func (w *Watcher) Start(context.Context) error {
	if len(w.providers) == 0 || w.cfg.Interval <= 0 {
		return nil
	}
	w.schedule.Start(w.cfg.Clock, w.cfg.Interval, func(ctx context.Context) {
		res, err := w.Fetch(ctx)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			w.log.Warn("scheduled price fetch failed", "providers", w.Provider(), "err", err)
			return
		}
		for _, p := range res.Providers {
			switch {
			case p.Err != "" && p.Stale:
				w.log.Warn("scheduled price fetch failed; its last good offers are stale and count in no current price", "provider", p.Provider, "err", p.Err,
					"stale_offers", p.Offers, "age", p.Age.Round(time.Second), "max_age", w.cfg.MaxOfferAge)
			case p.Err != "":
				w.log.Warn("scheduled price fetch failed; its last good offers are kept", "provider", p.Provider, "err", p.Err, "kept_offers", p.Offers,
					"age", p.Age.Round(time.Second), "max_age", w.cfg.MaxOfferAge)
			}
			if p.Skipped > 0 {
				w.log.Warn("price fetch skipped offers that could not be priced", "provider", p.Provider, "skipped", p.Skipped)
			}
		}
	})
	return nil
}

// Shutdown stops the schedule (an ongoing fetch is cancelled) and waits
// for it until ctx ends.
func (w *Watcher) Shutdown(ctx context.Context) error {
	return w.schedule.Shutdown(ctx)
}

// FetchResult says what a fetch did: the offers and models current after
// it (a failed provider's last good offers included while not stale), the
// alerts fired, and how each provider's fetch went.
type FetchResult struct {
	Offers, Models, Alerts int
	Providers              []ProviderResult
}

// ProviderResult is one provider's part of a fetch.
type ProviderResult struct {
	Provider string
	// Offers of the provider in the catalog now: from this fetch, or its
	// last good one when this one failed.
	Offers  int
	Skipped int       // entries of the answer that could not be priced
	Fetched time.Time // when the offers were fetched (zero: never)
	// Err is why this fetch failed ("" if it did not), at ErrTime.
	Err     string
	ErrTime time.Time
	// Stale: the offers are older than the max offer age, so none of them
	// is a current price; Age is theirs when the result was made.
	Stale    bool
	Age      time.Duration
	Imported bool // the catalog came from `trainmeter prices import`
}

// ErrNoProvider: the collector has no price provider configured.
var ErrNoProvider = errors.New("no price provider configured: start the collector with `trainmeter serve --price-provider vastai,lambda,runpod,azure` " +
	"(any of them; keys in $TRAINMETER_VASTAI_KEY, $TRAINMETER_LAMBDA_KEY, $TRAINMETER_RUNPOD_KEY or --vastai-key-file, --lambda-key-file, --runpod-key-file) " +
	"or `--price-provider file --price-file FILE`, or load a price list now with `trainmeter prices import FILE`")

// Fetch gets offers from every provider now (together), records each
// model's price point over all of them, and fires the price alerts due. A
// provider whose fetch fails (down, rate-limited past its retries, an
// answer that is not its API's, or no offer that can be priced) keeps its
// last good catalog and its error is in the result; only when every
// provider fails is the fetch an error (the errors go to Status), and
// nothing is recorded.
func (w *Watcher) Fetch(ctx context.Context) (FetchResult, error) {
	if len(w.providers) == 0 {
		return FetchResult{}, ErrNoProvider
	}
	w.fetchMu.Lock()
	defer w.fetchMu.Unlock()
	pctx := ctx
	if dl, ok := ctx.Deadline(); ok {
		// A provider still retrying when the caller's deadline nears
		// (`prices fetch --timeout`) fails alone: the answers that came
		// are recorded in the time left.
		var cancel context.CancelFunc
		pctx, cancel = context.WithTimeout(ctx, time.Until(dl)*9/10)
		defer cancel()
	}
	got, gotErr := make([]catalog, len(w.providers)), make([]error, len(w.providers))
	var wg sync.WaitGroup
	for i, p := range w.providers {
		wg.Go(func() {
			offers, skipped, err := p.FetchOffers(pctx)
			if err == nil && len(offers) == 0 {
				err = fmt.Errorf("%s returned no offers that can be priced (%s skipped)", p.Name(), plural.N(skipped, "entry"))
			}
			for j := range offers {
				offers[j].Provider = cmp.Or(offers[j].Provider, p.Name())
			}
			got[i], gotErr[i] = catalog{Provider: p.Name(), Offers: offers, Skipped: skipped}, err
		})
	}
	wg.Wait()
	now := w.cfg.Clock.Now().UTC()
	prev := w.latestSnapshot()
	var next snapshot
	configured := map[string]bool{}
	var errs []error
	for i, p := range w.providers {
		configured[p.Name()] = true
		if gotErr[i] == nil {
			got[i].Time = now
			next.Catalogs = append(next.Catalogs, got[i])
			continue
		}
		errs = append(errs, fmt.Errorf("%s: %w", p.Name(), gotErr[i]))
		c, _ := prev.catalog(p.Name()) // keep the last good answer
		c.Provider, c.Imported, c.LastError, c.LastErrorTime = p.Name(), false, gotErr[i].Error(), now
		next.Catalogs = append(next.Catalogs, c)
	}
	if len(errs) == len(w.providers) {
		// Nothing new: keep the catalog as it is, errors aside (the
		// status shows them).
		w.setErrors(now, next.Catalogs)
		return FetchResult{}, errors.Join(errs...)
	}
	for _, c := range prev.Catalogs {
		if c.Imported && !configured[c.Provider] {
			next.Catalogs = append(next.Catalogs, c)
		}
	}
	next.Time = now
	return w.commit(ctx, next)
}

// setErrors records a failed fetch's errors on the catalogs.
func (w *Watcher) setErrors(now time.Time, failed []catalog) {
	s := w.latestSnapshot()
	s.Catalogs = slices.Clone(s.Catalogs)
	for _, f := range failed {
		if i := slices.IndexFunc(s.Catalogs, func(c catalog) bool { return c.Provider == f.Provider }); i >= 0 {
			s.Catalogs[i].LastError, s.Catalogs[i].LastErrorTime = f.LastError, f.LastErrorTime
		} else {
			s.Catalogs = append(s.Catalogs, f)
		}
	}
	if b, err := json.Marshal(s); err == nil {
		_ = w.store.PutRecord(NSOffers, "catalogs", b)
	}
	w.setLatest(s)
}

// Status is how every provider's catalog stands, configured providers
// first, in their order.
func (w *Watcher) Status() []ProviderResult {
	w.mu.Lock()
	defer w.mu.Unlock()
	now := w.refresh()
	var out []ProviderResult
	seen := map[string]bool{}
	add := func(c catalog) {
		seen[c.Provider] = true
		out = append(out, c.result(now, w.cfg.MaxOfferAge))
	}
	for _, p := range w.providers {
		c, _ := w.latest.catalog(p.Name())
		c.Provider = p.Name() // a provider not fetched yet has no catalog
		add(c)
	}
	for _, c := range w.latest.Catalogs {
		if !seen[c.Provider] {
			add(c)
		}
	}
	return out
}

// Import records offers from elsewhere (a price list sent by the CLI) at
// the clock's now: they replace the catalogs of the providers they name
// (offers without a provider are "import"s) and stay beside the fetched
// providers' until another import of the same provider (or, for a
// configured provider, its next fetch).
func (w *Watcher) Import(ctx context.Context, offers []prices.Offer) (FetchResult, error) {
	w.fetchMu.Lock()
	defer w.fetchMu.Unlock()
	now := w.cfg.Clock.Now().UTC()
	imported := groupByProvider(offers, now)
	prev := w.latestSnapshot()
	next := snapshot{Time: now}
	names := map[string]bool{}
	for i := range imported {
		imported[i].Imported = true
		names[imported[i].Provider] = true
	}
	for _, c := range prev.Catalogs {
		if !names[c.Provider] {
			next.Catalogs = append(next.Catalogs, c)
		}
	}
	next.Catalogs = append(next.Catalogs, imported...)
	return w.commit(ctx, next)
}

func groupByProvider(offers []prices.Offer, now time.Time) []catalog {
	var out []catalog
	idx := map[string]int{}
	for _, o := range offers {
		o.Provider = cmp.Or(o.Provider, "import")
		i, ok := idx[o.Provider]
		if !ok {
			i = len(out)
			idx[o.Provider] = i
			out = append(out, catalog{Provider: o.Provider, Time: now})
		}
		out[i].Offers = append(out[i].Offers, o)
	}
	return out
}

// commit stores the merged catalog s, records each model's price point
// over its offers current at s.Time (a stale catalog's week-old price is
// not what was seen then) and fires the alerts due.
func (w *Watcher) commit(ctx context.Context, s snapshot) (FetchResult, error) {
	now := s.Time
	offers := s.currentOffers(now, w.cfg.MaxOfferAge)
	by := prices.ByModel(offers)
	res := FetchResult{Offers: len(offers), Models: len(by)}
	for _, c := range s.Catalogs {
		res.Providers = append(res.Providers, c.result(now, w.cfg.MaxOfferAge))
	}
	b, err := json.Marshal(s)
	if err != nil {
		return res, err
	}
	if err := w.store.PutRecord(NSOffers, "catalogs", b); err != nil {
		return res, err
	}
	var errs []error
	for _, k := range slices.Sorted(maps.Keys(by)) {
		mp := by[k]
		hist, err := w.history(k, now.Add(-Retention))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		pb, _ := json.Marshal(point{Time: now, ModelPrice: mp})
		if err := w.store.PutRecord(NSPrices, histKey(k, now), pb); err != nil {
			errs = append(errs, err)
			continue
		}
		w.prune(k, now.Add(-Retention))
		if mp.Offers == 0 {
			continue // spot offers only: no on-demand price to judge
		}
		p := prices.Point{Time: now, USD: mp.Median}
		prev := prices.StateNormal
		if b, err := w.store.GetRecord(NSPriceState, k); err == nil {
			prev = string(b)
		}
		c := prices.DefaultAlertRule.Check(toPoints(hist, ""), p, prev)
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
	}
	w.setLatest(s)
	return res, errors.Join(errs...)
}

func (w *Watcher) fire(ctx context.Context, k string, mp prices.ModelPrice, c prices.Change, now time.Time) (bool, error) {
	sev, what := alert.SeverityInfo, "dropped"
	if c.State == prices.StateSurge {
		sev, what = alert.SeverityWarning, "surged"
	}
	onDemandProviders := 0
	for _, pp := range mp.Providers {
		if pp.Offers > 0 {
			onDemandProviders++
		}
	}
	a := alert.Alert{
		Kind: alert.KindPrice, Severity: sev, Scope: mp.GPUName, Threshold: c.Change, Time: now,
		GPUName: mp.GPUName, PriceUSDPerHour: mp.Median, ReferenceUSDPerHour: c.Reference, Change: c.Change,
		Message: fmt.Sprintf("%s price %s %+.1f%%: median %s/GPU-h vs %s trailing %s average (on-demand, %s of %s; cheapest %s from %s)",
			mp.GPUName, what, 100*c.Change, money.Rate(mp.Median), money.Rate(c.Reference), fmt.Sprintf("%d h", prices.DefaultAlertRule.Window/time.Hour),
			plural.N(mp.Offers, "offer"), plural.N(onDemandProviders, "provider"), money.Rate(mp.Cheapest), mp.CheapestOffer.Provider),
	}
	return w.rec.Fire(ctx, fmt.Sprintf("%s/%s/%020d", alert.KindPrice, k, now.UnixNano()), a)
}

var histEscaper = strings.NewReplacer("%", "%25", "/", "%2F")

func histPrefix(k string) string { return histEscaper.Replace(k) + "/" }

func histKey(k string, t time.Time) string {
	return fmt.Sprintf("%s%020d", histPrefix(k), t.UnixNano())
}

// scanHistory calls fn with each stored point of model k, in time order.
func (w *Watcher) scanHistory(k string, fn func(key string, p point, ok bool) bool) error {
	return w.store.ScanRecords(NSPrices, histPrefix(k), func(key string, v []byte) (bool, error) {
		var p point
		ok := json.Unmarshal(v, &p) == nil
		return fn(key, p, ok), nil
	})
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

// toPoints is the on-demand median series of all providers (provider
// "") or of one; fetches without an on-demand offer there are no point.
func toPoints(h []point, provider string) []prices.Point {
	out := make([]prices.Point, 0, len(h))
	for _, p := range h {
		usd := p.Median
		if provider != "" {
			usd = p.Providers[provider].Median
		}
		if usd > 0 {
			out = append(out, prices.Point{Time: p.Time, USD: usd})
		}
	}
	return out
}

// CurrentPrice is the cheapest current on-demand per-GPU $/h of gpuName's
// model (modelKey) over every catalog not stale; the cost model's
// PriceCatalog. Spot prices are not a run's price: a model offered only as
// spot has none.
func (w *Watcher) CurrentPrice(gpuName string) (float64, bool) {
	mp, ok := w.current(gpuName)
	return mp.Cheapest, ok
}

// current is the current prices of gpuName's model; false when it has no
// current on-demand offer.
func (w *Watcher) current(gpuName string) (prices.ModelPrice, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.refresh()
	k, ok := w.modelKey(gpuName)
	return w.byKey[k], ok && w.byKey[k].Offers > 0
}

// CurrentOffer says where CurrentPrice's offer is: its provider, and its
// region when the provider names one (recommend.OfferCatalog).
func (w *Watcher) CurrentOffer(gpuName string) (string, bool) {
	mp, ok := w.current(gpuName)
	if !ok {
		return "", false
	}
	o := mp.CheapestOffer
	if o.Location != "" {
		return o.Provider + ", " + o.Location, true
	}
	return o.Provider, true
}

var Windows = []struct {
	Name string
	D    time.Duration
}{{"24h", 24 * time.Hour}, {"7d", 7 * 24 * time.Hour}, {"30d", 30 * 24 * time.Hour}}

type ModelView struct {
	prices.ModelPrice
	Fetched     time.Time
	Trends      map[string]prices.Trend
	Recommended []prices.Scored
}

// View returns the latest prices of every model (gpu empty) or one model
// (found by prices.Matcher, with recommendations), with trends over 24 h,
// 7 d and 30 d of the on-demand median price; over every provider's
// offers, or provider's only (provider non-empty).
func (w *Watcher) View(gpu, provider string, recommend int) ([]ModelView, error) {
	w.mu.Lock()
	now := w.refresh()
	latest, all, by := w.latest, w.all, w.byKey
	k, found := w.modelKey(gpu)
	stale := slices.Sorted(maps.Keys(w.stale))
	w.mu.Unlock()
	maxAge := w.cfg.MaxOfferAge
	fetchedAt := latest.Time
	if provider != "" {
		c, ok := latest.catalog(provider)
		if ok && len(c.Offers) > 0 && c.staleAt(now, maxAge) {
			lastErr := ""
			if c.LastError != "" {
				lastErr = " (last error: " + c.LastError + ")"
			}
			return nil, fmt.Errorf("the catalog of provider %q is stale: its last good answer (%s) is %v old, older than the max offer age %v, so its offers are no current prices%s",
				provider, c.Time.UTC().Format(time.RFC3339), now.Sub(c.Time).Round(time.Second), maxAge, lastErr)
		}
		if !ok || len(c.Offers) == 0 {
			var have []string
			for _, c := range latest.Catalogs {
				if len(c.Offers) > 0 {
					have = append(have, c.Provider)
				}
			}
			sort.Strings(have)
			return nil, fmt.Errorf("no offers from provider %q in the catalog (providers with offers: %s)", provider, cmp.Or(strings.Join(have, ", "), "none"))
		}
		all, by, fetchedAt = c.Offers, prices.ByModel(c.Offers), c.Time
	}
	keys := slices.Sorted(maps.Keys(by))
	if gpu != "" {
		if _, ok := by[k]; !found || !ok {
			if provider != "" {
				return nil, fmt.Errorf("no offers for GPU %q from provider %q", gpu, provider)
			}
			if len(stale) > 0 {
				return nil, fmt.Errorf("no current offers for GPU %q (the stale catalogs of %s, older than the max offer age %v, do not count)", gpu, strings.Join(stale, ", "), maxAge)
			}
			return nil, fmt.Errorf("no offers for GPU %q in the latest fetch", gpu)
		}
		keys = []string{k}
	}
	var out []ModelView
	for _, k := range keys {
		hist, err := w.history(k, now.Add(-Retention))
		if err != nil {
			return nil, err
		}
		pts := toPoints(hist, provider)
		v := ModelView{ModelPrice: by[k], Fetched: fetchedAt, Trends: map[string]prices.Trend{}}
		for _, win := range Windows {
			v.Trends[win.Name] = prices.TrendOver(pts, now, win.D)
		}
		if gpu != "" && recommend > 0 {
			rec := prices.Recommend(all, k)
			v.Recommended = rec[:min(recommend, len(rec))]
		}
		out = append(out, v)
	}
	return out, nil
}
