package prices

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"net/http"
	"slices"
	"strings"
)

// DefaultLambdaURL is Lambda's cloud API server.
const DefaultLambdaURL = "https://cloud.lambda.ai"

// Lambda fetches Lambda Cloud's on-demand instance types from
// GET {BaseURL}/api/v1/instance-types ({"data": {NAME: lambdaInstanceType}}).
// Each instance type gives one offer per region with capacity now (an
// instance type without capacity gives none); the offer's price is
// price_cents_per_hour / 100 for all specs.gpus GPUs, so its per-GPU price
// is that divided by specs.gpus. The GPU model is gpu_description ("H100
// (80 GB SXM5)"), else description without its "8x " count.
type Lambda struct {
	BaseURL string // DefaultLambdaURL if empty
	APIKey  string // sent as a Bearer token (Lambda's API needs one)
	HTTPOptions
}

func (*Lambda) Name() string { return "lambda" }

func (l *Lambda) FetchOffers(ctx context.Context) ([]Offer, int, error) {
	base := cmp.Or(strings.TrimRight(l.BaseURL, "/"), DefaultLambdaURL)
	body, err := l.get(ctx, "Lambda instance types from "+base, http.MethodGet, base+"/api/v1/instance-types", l.APIKey, nil)
	if err != nil {
		return nil, 0, err
	}
	return ParseLambdaInstanceTypes(body, l.Name())
}

type lambdaInstanceType struct {
	InstanceType struct {
		Name              string  `json:"name"`
		Description       string  `json:"description"`
		GPUDescription    string  `json:"gpu_description"`
		PriceCentsPerHour float64 `json:"price_cents_per_hour"` // null: 0, not priced
		Specs             struct {
			GPUs float64 `json:"gpus"`
		} `json:"specs"`
	} `json:"instance_type"`
	Regions []struct {
		Name        string `json:"name"`
		Description string `json:"description"`
	} `json:"regions_with_capacity_available"`
}

// ParseLambdaInstanceTypes decodes Lambda's instance-types answer (see
// Lambda). An instance type that cannot be priced (no price, no whole
// number of GPUs >= 1, no GPU name, a field of the wrong type) is skipped
// and counted; an answer without a "data" object is an error.
func ParseLambdaInstanceTypes(body []byte, provider string) (offers []Offer, skipped int, err error) {
	var doc struct {
		Data map[string]json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(body, &doc); err != nil {
		return nil, 0, fmt.Errorf("Lambda instance types: %w", err)
	}
	if doc.Data == nil {
		return nil, 0, errors.New(`Lambda instance types: no "data" object`)
	}
	for _, k := range slices.Sorted(maps.Keys(doc.Data)) {
		var it lambdaInstanceType
		if err := json.Unmarshal(doc.Data[k], &it); err != nil {
			skipped++
			continue
		}
		t := it.InstanceType
		gpu := cmp.Or(strings.TrimSpace(t.GPUDescription), strings.TrimSpace(stripCount(t.Description)))
		n := 0
		if g := t.Specs.GPUs; g == math.Trunc(g) && g >= 1 && g <= math.MaxInt32 {
			n = int(g)
		}
		name := cmp.Or(t.Name, k)
		o := Offer{ID: name, Provider: provider, GPUName: gpu, NumGPUs: n, USDPerHour: t.PriceCentsPerHour / 100, GPURAMGB: float64(ParseGPUModel(gpu).MemGB)}
		if o.Validate() != nil {
			skipped++
			continue
		}
		for _, r := range it.Regions {
			if strings.TrimSpace(r.Name) == "" {
				continue
			}
			ro := o
			ro.ID, ro.Location = name+"@"+r.Name, r.Name
			offers = append(offers, ro)
		}
	}
	return offers, skipped, nil
}

// stripCount drops a leading "8x " from a description ("8x H100 (80 GB
// SXM5)").
func stripCount(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, ' '); i > 1 && (s[i-1] == 'x' || s[i-1] == 'X') && isDigits(s[:i-1]) {
		return s[i+1:]
	}
	return s
}
