package prices

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// DefaultVastAIURL is vast.ai's API server.
const DefaultVastAIURL = "https://console.vast.ai"

// VastAI fetches on-demand offers from vast.ai's search endpoint,
// GET {BaseURL}/api/v0/bundles/?q={query}, whose answer is
// {"offers": [ {...}, ... ]} with vast.ai's field names (gpu_name,
// num_gpus, gpu_ram in MB, dph_total in $/h for all num_gpus,
// reliability2 or reliability, dlperf_per_dphtotal, inet_down,
// geolocation, id).
type VastAI struct {
	// BaseURL of the API (DefaultVastAIURL if empty).
	BaseURL string
	// APIKey, if set, is sent as "Authorization: Bearer KEY" (the offer
	// search also works without one).
	APIKey string
	// Query is the JSON search query; empty: rentable on-demand offers.
	Query string
	// Client is the HTTP client (a 30 s timeout one if nil).
	Client *http.Client
	// MaxAttempts on HTTP 429 and 5xx; 0: 5.
	MaxAttempts int
	// MaxBackoff caps the exponential backoff between attempts; 0: 60 s.
	MaxBackoff time.Duration
	// MaxRetryAfter caps the wait a Retry-After header asks for (a rate
	// limit often asks for minutes); 0: 10 min.
	MaxRetryAfter time.Duration
	// Sleep waits between attempts (tests replace it); nil: a timer
	// that ends early when ctx does.
	Sleep func(ctx context.Context, d time.Duration) error
}

// DefaultMaxRetryAfter is the longest Retry-After the client honours.
const DefaultMaxRetryAfter = 10 * time.Minute

// DefaultVastAIQuery asks for rentable on-demand offers.
const DefaultVastAIQuery = `{"rentable":{"eq":true},"rented":{"eq":false},"type":"on-demand","limit":1000}`

// Name implements Provider.
func (*VastAI) Name() string { return "vastai" }

// vastOffer has the fields of a vast.ai offer that we read.
type vastOffer struct {
	ID                json.Number `json:"id"`
	GPUName           string      `json:"gpu_name"`
	NumGPUs           float64     `json:"num_gpus"`
	GPURAM            float64     `json:"gpu_ram"` // MB
	DPHTotal          float64     `json:"dph_total"`
	Reliability       *float64    `json:"reliability"`
	Reliability2      *float64    `json:"reliability2"`
	DLPerfPerDPHTotal float64     `json:"dlperf_per_dphtotal"`
	InetDown          float64     `json:"inet_down"`
	Geolocation       string      `json:"geolocation"`
}

func (v vastOffer) offer(provider string) Offer {
	rel := v.Reliability2
	if rel == nil {
		rel = v.Reliability
	}
	n := 0 // a fraction of GPUs cannot be priced per GPU: skipped
	if v.NumGPUs == math.Trunc(v.NumGPUs) && v.NumGPUs >= 1 && v.NumGPUs <= math.MaxInt32 {
		n = int(v.NumGPUs)
	}
	return Offer{
		ID: v.ID.String(), Provider: provider, GPUName: strings.TrimSpace(v.GPUName), NumGPUs: n,
		GPURAMGB: v.GPURAM / 1024, USDPerHour: v.DPHTotal, Reliability: rel, DLPerfPerUSD: v.DLPerfPerDPHTotal,
		Location: v.Geolocation, InetDownMbps: v.InetDown,
	}
}

// ParseVastAIOffers decodes a vast.ai offers answer ({"offers": [...]}, or
// a bare array of offers). Offers that cannot be priced are dropped and
// counted in skipped.
func ParseVastAIOffers(r io.Reader, provider string) (offers []Offer, skipped int, err error) {
	raw, err := io.ReadAll(io.LimitReader(r, 256<<20))
	if err != nil {
		return nil, 0, err
	}
	var list []vastOffer
	trimmed := strings.TrimSpace(string(raw))
	if strings.HasPrefix(trimmed, "[") {
		err = json.Unmarshal(raw, &list)
	} else {
		var doc struct {
			Offers *[]vastOffer `json:"offers"`
		}
		err = json.Unmarshal(raw, &doc)
		if err == nil && doc.Offers == nil {
			err = errors.New(`no "offers" array`)
		}
		if doc.Offers != nil {
			list = *doc.Offers
		}
	}
	if err != nil {
		return nil, 0, fmt.Errorf("vast.ai offers: %w", err)
	}
	for _, v := range list {
		o := v.offer(provider)
		if o.Validate() != nil {
			skipped++
			continue
		}
		offers = append(offers, o)
	}
	return offers, skipped, nil
}

// HTTPError is a non-2xx answer.
type HTTPError struct {
	Status int
	Body   string
}

func (e *HTTPError) Error() string {
	return fmt.Sprintf("HTTP %d: %s", e.Status, e.Body)
}

// Offers implements Provider. HTTP 429 and 5xx are retried with capped
// exponential backoff and jitter, waiting at least what Retry-After says
// (up to MaxRetryAfter).
func (v *VastAI) Offers(ctx context.Context) ([]Offer, error) {
	offers, _, err := v.FetchOffers(ctx)
	return offers, err
}

// FetchOffers implements CountingProvider.
func (v *VastAI) FetchOffers(ctx context.Context) ([]Offer, int, error) {
	base := strings.TrimRight(v.BaseURL, "/")
	if base == "" {
		base = DefaultVastAIURL
	}
	q := v.Query
	if q == "" {
		q = DefaultVastAIQuery
	}
	u := base + "/api/v0/bundles/?q=" + url.QueryEscape(q)
	opts := HTTPOptions{Client: v.Client, MaxAttempts: v.MaxAttempts, MaxBackoff: v.MaxBackoff, MaxRetryAfter: v.MaxRetryAfter, Sleep: v.Sleep}
	body, err := opts.get(ctx, "vast.ai offers from "+base, func(ctx context.Context) (*http.Request, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
		if err != nil {
			return nil, err
		}
		req.Header.Set("Accept", "application/json")
		if v.APIKey != "" {
			req.Header.Set("Authorization", "Bearer "+v.APIKey)
		}
		return req, nil
	})
	if err != nil {
		return nil, 0, err
	}
	return ParseVastAIOffers(bytes.NewReader(body), v.Name())
}

// retryAfter parses a Retry-After header (seconds or an HTTP date).
func retryAfter(h string) time.Duration {
	h = strings.TrimSpace(h)
	if h == "" {
		return 0
	}
	if s, err := strconv.Atoi(h); err == nil && s >= 0 {
		return time.Duration(s) * time.Second
	}
	if t, err := http.ParseTime(h); err == nil {
		return max(0, time.Until(t))
	}
	return 0
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
