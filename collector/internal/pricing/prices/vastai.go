package prices

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"strings"
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
	BaseURL string // DefaultVastAIURL if empty
	// APIKey, if set, is sent as "Authorization: Bearer KEY" (the offer
	// search also works without one).
	APIKey string
	Query  string // the JSON search query; empty: DefaultVastAIQuery
	HTTPOptions
}

// DefaultVastAIQuery asks for rentable on-demand offers.
const DefaultVastAIQuery = `{"rentable":{"eq":true},"rented":{"eq":false},"type":"on-demand","limit":1000}`

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
	rel := cmp.Or(v.Reliability2, v.Reliability)
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

func (v *VastAI) FetchOffers(ctx context.Context) ([]Offer, int, error) {
	base := cmp.Or(strings.TrimRight(v.BaseURL, "/"), DefaultVastAIURL)
	q := cmp.Or(v.Query, DefaultVastAIQuery)
	body, err := v.get(ctx, "vast.ai offers from "+base, http.MethodGet, base+"/api/v0/bundles/?q="+url.QueryEscape(q), v.APIKey, nil)
	if err != nil {
		return nil, 0, err
	}
	return ParseVastAIOffers(bytes.NewReader(body), v.Name())
}
