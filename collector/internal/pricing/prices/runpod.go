package prices

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
)

// DefaultRunPodURL is RunPod's GraphQL endpoint.
const DefaultRunPodURL = "https://api.runpod.io/graphql"

// RunPodQuery asks for every GPU type's prices and stock.
const RunPodQuery = `query { gpuTypes { id displayName memoryInGb securePrice communityPrice secureSpotPrice communitySpotPrice ` +
	`lowestPrice(input:{gpuCount:1}) { minimumBidPrice uninterruptablePrice stockStatus } } }`

// RunPod fetches RunPod's GPU types by POSTing RunPodQuery to its GraphQL
// endpoint ({"data": {"gpuTypes": [runpodGPUType]}}, or {"errors": [...]}
// when the query fails). RunPod prices one GPU for an hour; a GPU type gives up
// to four offers of one GPU: Secure Cloud and Community Cloud, each
// on-demand (securePrice, communityPrice) and spot (secureSpotPrice,
// communitySpotPrice), those with a price > 0. A GPU type whose
// lowestPrice.stockStatus is empty or null is out of stock and gives none.
type RunPod struct {
	URL    string // of the GraphQL endpoint; DefaultRunPodURL if empty
	APIKey string // sent as a Bearer token
	HTTPOptions
}

func (*RunPod) Name() string { return "runpod" }

func (r *RunPod) FetchOffers(ctx context.Context) ([]Offer, int, error) {
	u := cmp.Or(r.URL, DefaultRunPodURL)
	q, _ := json.Marshal(map[string]string{"query": RunPodQuery})
	body, err := r.get(ctx, "RunPod GPU types from "+u, http.MethodPost, u, r.APIKey, q)
	if err != nil {
		return nil, 0, err
	}
	return ParseRunPodGPUTypes(body, r.Name())
}

type runpodGPUType struct {
	ID          string  `json:"id"`
	DisplayName string  `json:"displayName"`
	MemoryInGb  float64 `json:"memoryInGb"`
	// A price that is null or 0: not offered in that cloud.
	SecurePrice        float64 `json:"securePrice"`
	CommunityPrice     float64 `json:"communityPrice"`
	SecureSpotPrice    float64 `json:"secureSpotPrice"`
	CommunitySpotPrice float64 `json:"communitySpotPrice"`
	LowestPrice        struct {
		StockStatus string `json:"stockStatus"`
	} `json:"lowestPrice"`
}

// ParseRunPodGPUTypes decodes RunPod's gpuTypes answer (see RunPod). A GPU
// type that cannot be read (a field of the wrong type, no name, a negative
// or non-finite price) is skipped and counted; an answer
// with GraphQL errors or without data.gpuTypes is an error.
func ParseRunPodGPUTypes(body []byte, provider string) (offers []Offer, skipped int, err error) {
	var doc struct {
		Data *struct {
			GPUTypes *[]json.RawMessage `json:"gpuTypes"`
		} `json:"data"`
		Errors []struct {
			Message string `json:"message"`
		} `json:"errors"`
	}
	if err := json.Unmarshal(body, &doc); err != nil {
		return nil, 0, fmt.Errorf("RunPod GPU types: %w", err)
	}
	if len(doc.Errors) > 0 {
		msgs := make([]string, len(doc.Errors))
		for i, e := range doc.Errors {
			msgs[i] = e.Message
		}
		return nil, 0, fmt.Errorf("RunPod GPU types: GraphQL errors: %s", strings.Join(msgs, "; "))
	}
	if doc.Data == nil || doc.Data.GPUTypes == nil {
		return nil, 0, errors.New("RunPod GPU types: no data.gpuTypes array")
	}
types:
	for _, raw := range *doc.Data.GPUTypes {
		var g runpodGPUType
		if err := json.Unmarshal(raw, &g); err != nil {
			skipped++
			continue
		}
		name := cmp.Or(strings.TrimSpace(g.DisplayName), strings.TrimSpace(g.ID))
		id := cmp.Or(g.ID, name)
		var these []Offer
		for _, p := range []struct {
			price float64
			kind  string
			spot  bool
		}{{g.SecurePrice, "secure", false}, {g.CommunityPrice, "community", false}, {g.SecureSpotPrice, "secure spot", true}, {g.CommunitySpotPrice, "community spot", true}} {
			if p.price == 0 {
				continue
			}
			o := Offer{ID: id + " " + p.kind, Provider: provider, GPUName: name, NumGPUs: 1, GPURAMGB: g.MemoryInGb, USDPerHour: p.price, Spot: p.spot}
			if o.Validate() != nil {
				skipped++
				continue types
			}
			these = append(these, o)
		}
		if len(these) == 0 {
			continue // a type no cloud offers
		}
		if strings.TrimSpace(g.LowestPrice.StockStatus) == "" {
			continue // out of stock: not rentable now
		}
		offers = append(offers, these...)
	}
	return offers, skipped, nil
}
