// Package prices fetches GPU rental prices (clients of vast.ai's offers,
// Lambda's instance types, RunPod's GPU types and Azure's retail prices, or
// a CSV/JSON price list), and computes what the collector shows and alerts
// on: per-model cheapest and median prices (on-demand and spot apart, over
// every provider under one canonical model name), trends, price-change
// alerts against a trailing average, and ranked recommendations.
// Everything here but the clients is pure: functions of offers and price
// series.
package prices

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"time"
)

// Offer is one rentable machine (or slice of one).
type Offer struct {
	ID       string `json:"id"`
	Provider string `json:"provider"`
	GPUName  string `json:"gpu_name"`
	NumGPUs  int    `json:"num_gpus"`
	// GPURAMGB is the memory of one GPU.
	GPURAMGB float64 `json:"gpu_ram_gb,omitempty"`
	// USDPerHour is the price of the whole offer (all its GPUs).
	USDPerHour float64 `json:"usd_per_hour"`
	// Reliability in [0, 1] as the provider estimates it (vast.ai's
	// reliability2); nil: unknown (the provider or the list gives none).
	Reliability *float64 `json:"reliability,omitempty"`
	// DLPerfPerUSD is the provider's deep-learning performance per $/h
	// (vast.ai's dlperf_per_dphtotal); 0 = unknown.
	DLPerfPerUSD float64 `json:"dlperf_per_usd,omitempty"`
	// Location is where the offer runs, as the provider names it: a region
	// (Lambda's "us-east-1", Azure's armRegionName "eastus") or vast.ai's
	// geolocation ("Texas, US"); empty where the provider says none
	// (RunPod's GPU types).
	Location     string  `json:"location,omitempty"`
	InetDownMbps float64 `json:"inet_down_mbps,omitempty"`
	// Spot: the offer is interruptible (spot, low priority, community
	// spot); its price is kept apart from the on-demand prices.
	Spot bool `json:"spot,omitempty"`
}

// PerGPUHour is the offer's price per GPU-hour.
func (o Offer) PerGPUHour() float64 {
	if o.NumGPUs <= 0 {
		return o.USDPerHour
	}
	return o.USDPerHour / float64(o.NumGPUs)
}

// Validate rejects offers that cannot be priced.
func (o Offer) Validate() error {
	switch {
	case strings.TrimSpace(o.GPUName) == "":
		return fmt.Errorf("offer %q: no gpu_name", o.ID)
	case o.NumGPUs <= 0:
		return fmt.Errorf("offer %q (%s): num_gpus %d", o.ID, o.GPUName, o.NumGPUs)
	case !(o.USDPerHour > 0) || math.IsInf(o.USDPerHour, 0):
		return fmt.Errorf("offer %q (%s): price %v $/h", o.ID, o.GPUName, o.USDPerHour)
	case o.Reliability != nil && !(*o.Reliability >= 0 && *o.Reliability <= 1):
		return fmt.Errorf("offer %q (%s): reliability %v not in [0, 1]", o.ID, o.GPUName, *o.Reliability)
	case o.DLPerfPerUSD < 0 || math.IsNaN(o.DLPerfPerUSD) || math.IsInf(o.DLPerfPerUSD, 0):
		return fmt.Errorf("offer %q (%s): dlperf_per_dphtotal %v", o.ID, o.GPUName, o.DLPerfPerUSD)
	case o.GPURAMGB < 0 || math.IsNaN(o.GPURAMGB) || math.IsInf(o.GPURAMGB, 0):
		return fmt.Errorf("offer %q (%s): gpu_ram %v GB", o.ID, o.GPUName, o.GPURAMGB)
	case o.InetDownMbps < 0 || math.IsNaN(o.InetDownMbps) || math.IsInf(o.InetDownMbps, 0):
		return fmt.Errorf("offer %q (%s): inet_down %v Mbit/s", o.ID, o.GPUName, o.InetDownMbps)
	}
	return nil
}

// Provider is a source of offers.
type Provider interface {
	// Name is a short name for logs and alerts ("vastai", "file").
	Name() string
	// FetchOffers returns the offers available now, and how many entries
	// of the answer it skipped because they could not be priced (a
	// missing price, no GPU count, a field of the wrong type): the rest of
	// the answer is kept.
	FetchOffers(ctx context.Context) (offers []Offer, skipped int, err error)
}

// Key is how GPU model names are matched: case-insensitively, with runs of
// spaces, dashes and underscores as one space ("RTX_4090" = "rtx 4090").
func Key(gpuName string) string {
	f := strings.FieldsFunc(strings.ToLower(gpuName), func(r rune) bool { return r == ' ' || r == '-' || r == '_' || r == '\t' })
	return strings.Join(f, " ")
}

// ModelPrice is one GPU model's price at one fetch, over all providers.
// On-demand and spot offers are kept apart: Cheapest, Median, Offers and
// CheapestOffer are the on-demand offers' (the price a run is charged and
// alerts follow), the Spot fields the interruptible offers'.
type ModelPrice struct {
	GPUName string `json:"gpu_name"` // CanonicalGPUName
	// Cheapest and Median per-GPU $/h over the model's on-demand offers
	// (0 when it has none).
	Cheapest float64 `json:"cheapest"`
	Median   float64 `json:"median"`
	Offers   int     `json:"offers"`
	// CheapestOffer is the on-demand offer with the cheapest per-GPU price.
	CheapestOffer Offer `json:"cheapest_offer"`
	// CheapestSpot, MedianSpot and SpotOffers: the same over spot offers.
	CheapestSpot      float64 `json:"cheapest_spot,omitempty"`
	MedianSpot        float64 `json:"median_spot,omitempty"`
	SpotOffers        int     `json:"spot_offers,omitempty"`
	CheapestSpotOffer Offer   `json:"cheapest_spot_offer,omitzero"`
	// Providers is the same per provider (its offers of this model only).
	Providers map[string]ProviderPrice `json:"providers,omitempty"`
}

// ProviderPrice is one provider's prices of one GPU model at one fetch,
// per GPU-hour.
type ProviderPrice struct {
	Cheapest     float64 `json:"cheapest,omitempty"`
	Median       float64 `json:"median,omitempty"`
	Offers       int     `json:"offers,omitempty"`
	CheapestSpot float64 `json:"cheapest_spot,omitempty"`
	MedianSpot   float64 `json:"median_spot,omitempty"`
	SpotOffers   int     `json:"spot_offers,omitempty"`
}

// ModelKey is the key offers of gpuName are grouped under: the key of its
// canonical name, so that vast.ai's "H100 SXM", Lambda's "H100 (80 GB
// SXM5)" and NVML's "NVIDIA H100 80GB HBM3" are one model.
func ModelKey(gpuName string) string { return Key(CanonicalGPUName(gpuName)) }

// stats of offers sorted by per-GPU price.
func stats(sorted []Offer) (cheapest, med float64) {
	if len(sorted) == 0 {
		return 0, 0
	}
	ps := make([]float64, len(sorted))
	for i, o := range sorted {
		ps[i] = o.PerGPUHour()
	}
	return ps[0], Median(ps)
}

// ByModel groups valid offers by GPU model (ModelKey); invalid offers are
// skipped.
func ByModel(offers []Offer) map[string]ModelPrice {
	groups := map[string][]Offer{}
	for _, o := range offers {
		if o.Validate() != nil {
			continue
		}
		k := ModelKey(o.GPUName)
		groups[k] = append(groups[k], o)
	}
	out := make(map[string]ModelPrice, len(groups))
	for k, g := range groups {
		sort.SliceStable(g, func(i, j int) bool { return g[i].PerGPUHour() < g[j].PerGPUHour() })
		var onDemand, spot []Offer
		byProvider := map[string][2][]Offer{}
		for _, o := range g {
			i := 0
			if o.Spot {
				spot = append(spot, o)
				i = 1
			} else {
				onDemand = append(onDemand, o)
			}
			pg := byProvider[o.Provider]
			pg[i] = append(pg[i], o)
			byProvider[o.Provider] = pg
		}
		mp := ModelPrice{GPUName: CanonicalGPUName(g[0].GPUName), Offers: len(onDemand), SpotOffers: len(spot), Providers: map[string]ProviderPrice{}}
		mp.Cheapest, mp.Median = stats(onDemand)
		mp.CheapestSpot, mp.MedianSpot = stats(spot)
		if len(onDemand) > 0 {
			mp.CheapestOffer = onDemand[0]
		}
		if len(spot) > 0 {
			mp.CheapestSpotOffer = spot[0]
		}
		for name, pg := range byProvider {
			pp := ProviderPrice{Offers: len(pg[0]), SpotOffers: len(pg[1])}
			pp.Cheapest, pp.Median = stats(pg[0])
			pp.CheapestSpot, pp.MedianSpot = stats(pg[1])
			mp.Providers[name] = pp
		}
		out[k] = mp
	}
	return out
}

// Median of sorted values (not empty).
func Median(sorted []float64) float64 {
	n := len(sorted)
	if n%2 == 1 {
		return sorted[n/2]
	}
	return (sorted[n/2-1] + sorted[n/2]) / 2
}

// The recommendation score's weights (they sum to 1): price matters most,
// then reliability (a cheap machine that disappears mid-run costs a
// restart), then performance per dollar.
const (
	weightPrice       = 0.4
	weightReliability = 0.3
	weightPerf        = 0.3
)

// Scored is an offer with its recommendation score in [0, 1].
type Scored struct {
	Offer
	Score float64 `json:"score"`
}

// Recommend ranks the valid offers of gpuName (all models if empty), best
// first. Each offer scores
//
//	0.4·(cheapest per-GPU price / its per-GPU price)
//	+ 0.3·reliability
//	+ 0.3·(its dlperf per $ / the best dlperf per $)
//
// in [0, 1]; an unknown dlperf counts 0. An offer whose reliability is
// unknown is scored on the other two terms alone (their weights scaled to
// sum 1): it is neither ranked as unreliable nor as reliable.
func Recommend(offers []Offer, gpuName string) []Scored {
	var cand []Offer
	for _, o := range offers {
		if o.Validate() == nil && (gpuName == "" || ModelKey(o.GPUName) == ModelKey(gpuName)) {
			cand = append(cand, o)
		}
	}
	if len(cand) == 0 {
		return nil
	}
	minPrice, maxPerf := math.Inf(1), 0.0
	for _, o := range cand {
		minPrice = min(minPrice, o.PerGPUHour())
		maxPerf = max(maxPerf, o.DLPerfPerUSD)
	}
	out := make([]Scored, len(cand))
	for i, o := range cand {
		s, of := weightPrice*(minPrice/o.PerGPUHour()), 1.0
		if maxPerf > 0 {
			s += weightPerf * (o.DLPerfPerUSD / maxPerf)
		}
		if o.Reliability != nil {
			s += weightReliability * *o.Reliability
		} else {
			of -= weightReliability
		}
		out[i] = Scored{Offer: o, Score: s / of}
	}
	slices.SortStableFunc(out, func(a, b Scored) int { // best score first, then cheapest
		return cmp.Or(cmp.Compare(b.Score, a.Score), cmp.Compare(a.PerGPUHour(), b.PerGPUHour()))
	})
	return out
}

// Point is one GPU model's price at one time: the series trends and alerts
// are computed on (the collector records the median per-GPU price of each
// fetch: a single odd cheap offer does not move it).
type Point struct {
	Time time.Time `json:"t"`
	USD  float64   `json:"usd"`
}

// Trend summarises a series over a window ending at now.
type Trend struct {
	Window time.Duration
	// Change is (latest − first point in the window) / first point.
	Change         float64
	Min, Max, Mean float64
	Points         int
}

// TrendOver computes the trend of series (sorted by time) over the window
// (now−window, now]. Fewer than two points: Change 0.
func TrendOver(series []Point, now time.Time, window time.Duration) Trend {
	t := Trend{Window: window}
	from := now.Add(-window)
	var first, last Point
	for _, p := range series {
		if !p.Time.After(from) || p.Time.After(now) {
			continue
		}
		if t.Points == 0 {
			first, t.Min, t.Max = p, p.USD, p.USD
		}
		last = p
		t.Points++
		t.Min, t.Max = min(t.Min, p.USD), max(t.Max, p.USD)
		t.Mean += p.USD
	}
	if t.Points == 0 {
		return t
	}
	t.Mean /= float64(t.Points)
	if t.Points > 1 && first.USD > 0 {
		t.Change = last.USD/first.USD - 1
	}
	return t
}

// AlertRule says when a price change is an alert.
type AlertRule struct {
	// Window is the trailing window the average is taken over: the points in
	// [t−Window, t) before the new point at t.
	Window time.Duration
	// MinPoints is how many points that window needs before any alert (so
	// that the first fetches do not alert against a one-point "average").
	MinPoints int
	// Drop and Surge are the relative changes that alert: a new price more
	// than Drop below the trailing average, or more than Surge above it.
	Drop, Surge float64
}

// DefaultAlertRule: more than 10 % below or 20 % above the 24 h trailing
// average of at least 3 earlier fetches.
var DefaultAlertRule = AlertRule{Window: 24 * time.Hour, MinPoints: 3, Drop: 0.10, Surge: 0.20}

// Price states of a model.
const (
	StateNormal = "normal"
	StateDrop   = "drop"
	StateSurge  = "surge"
)

// Change is the verdict on one new point.
type Change struct {
	State string // normal, drop or surge
	// Reference is the trailing average, Change = point/Reference − 1.
	Reference, Change float64
	// Fire: State is drop or surge and differs from the previous state.
	// Alerts are edge-triggered: a price that stays low alerts once, not at
	// every fetch until the average catches up.
	Fire bool
}

// Check judges the new point p against the earlier points history (any
// order) under the rule, given the model's previous state ("" = normal).
func (r AlertRule) Check(history []Point, p Point, prev string) Change {
	var sum float64
	n := 0
	from := p.Time.Add(-r.Window)
	for _, h := range history {
		if !h.Time.Before(from) && h.Time.Before(p.Time) {
			sum += h.USD
			n++
		}
	}
	c := Change{State: StateNormal}
	if n < r.MinPoints || sum <= 0 {
		return c
	}
	c.Reference = sum / float64(n)
	c.Change = p.USD/c.Reference - 1
	switch {
	case c.Change < -r.Drop:
		c.State = StateDrop
	case c.Change > r.Surge:
		c.State = StateSurge
	}
	prev = cmp.Or(prev, StateNormal)
	c.Fire = c.State != StateNormal && c.State != prev
	return c
}
