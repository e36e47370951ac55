package server

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/trainmeter/trainmeter/collector/internal/alert"
	"github.com/trainmeter/trainmeter/collector/internal/budget"
	"github.com/trainmeter/trainmeter/collector/internal/pricing/prices"
	"github.com/trainmeter/trainmeter/collector/internal/pricing/pricewatch"
)

// BudgetConfig configures budgets (docs/budgets.md).
type BudgetConfig struct {
	// EvalInterval: how often budgets are evaluated after runs changed.
	EvalInterval time.Duration
	// Timezone of monthly budgets' calendar months (IANA name); "": UTC.
	Timezone string
}

// Validate checks the config.
func (c BudgetConfig) Validate() error {
	var errs []error
	if c.EvalInterval < 0 {
		errs = append(errs, fmt.Errorf("budget evaluation interval must be >= 0, got %v", c.EvalInterval))
	}
	if _, err := time.LoadLocation(c.Timezone); err != nil {
		errs = append(errs, fmt.Errorf("budget timezone %q: %v", c.Timezone, err))
	}
	return errors.Join(errs...)
}

// AlertConfig configures where the alerts of budgets, run cost caps and
// price watching go, besides the store (docs/budgets.md).
type AlertConfig struct {
	// Webhook delivery of alerts (URLs empty: none).
	Webhook alert.WebhookConfig
	// Sinks are told of every alert besides the webhooks and the OTel log
	// export.
	Sinks []alert.Sink
}

// Validate checks the config.
func (c AlertConfig) Validate() error { return c.Webhook.Validate() }

// PriceConfig configures where GPU prices come from (docs/budgets.md).
type PriceConfig struct {
	// Provider: "" (none), or one or several of PriceProviders,
	// comma-separated ("vastai,lambda,runpod,azure"), fetched together.
	Provider string
	// VastAIURL is the vast.ai API base URL ("": prices.DefaultVastAIURL);
	// VastAIKey its optional bearer key.
	VastAIURL, VastAIKey string
	// LambdaURL is Lambda's API base URL ("": prices.DefaultLambdaURL);
	// LambdaKey its API key (required).
	LambdaURL, LambdaKey string
	// RunPodURL is RunPod's GraphQL endpoint ("": prices.DefaultRunPodURL);
	// RunPodKey its API key (required).
	RunPodURL, RunPodKey string
	// AzureURL is Azure's retail prices API base URL ("":
	// prices.DefaultAzureURL); AzureRegions keeps to these armRegionNames
	// (none: every region).
	AzureURL     string
	AzureRegions []string
	// File is the CSV or JSON price list of the file provider.
	File string
	// FetchInterval between scheduled fetches (the first at start); 0: on
	// demand only.
	FetchInterval time.Duration
	// MaxOfferAge: a fetched catalog whose last good answer is older is
	// stale, no current price (docs/costs.md); 0:
	// pricewatch.DefaultMaxOfferAge(FetchInterval).
	MaxOfferAge time.Duration
}

// PriceProviders are the names --price-provider takes.
var PriceProviders = []string{"vastai", "lambda", "runpod", "azure", "file"}

// providerNames splits Provider into names ("" gives none).
func (c PriceConfig) providerNames() []string {
	var out []string
	for _, n := range strings.Split(c.Provider, ",") {
		if n = strings.TrimSpace(n); n != "" {
			out = append(out, n)
		}
	}
	return out
}

func (c PriceConfig) has(name string) bool {
	return slices.Contains(c.providerNames(), name)
}

// Validate checks the config.
func (c PriceConfig) Validate() error {
	var errs []error
	seen := map[string]bool{}
	for _, n := range c.providerNames() {
		if seen[n] {
			errs = append(errs, fmt.Errorf("price provider %q given twice", n))
			continue
		}
		seen[n] = true
		switch n {
		case "vastai", "azure":
		case "lambda":
			if c.LambdaKey == "" {
				errs = append(errs, errors.New("--price-provider lambda needs Lambda's API key: --lambda-key-file FILE or $TRAINMETER_LAMBDA_KEY"))
			}
		case "runpod":
			if c.RunPodKey == "" {
				errs = append(errs, errors.New("--price-provider runpod needs RunPod's API key: --runpod-key-file FILE or $TRAINMETER_RUNPOD_KEY"))
			}
		case "file":
			if c.File == "" {
				errs = append(errs, errors.New("--price-provider file needs --price-file"))
			}
		default:
			errs = append(errs, fmt.Errorf("price provider %q: want one or several of %s, comma-separated", n, strings.Join(PriceProviders, ", ")))
		}
	}
	return errors.Join(append(errs, pricewatch.ValidateSchedule(c.FetchInterval, c.MaxOfferAge))...)
}

// checkFiles checks, at start, that the files the config names can be
// read (Validate checks only the values): a missing price file would
// otherwise show only as failed fetches. The file provider re-reads the
// file at each fetch; what it holds is checked then.
func (c PriceConfig) checkFiles() error {
	if !c.has("file") {
		return nil
	}
	f, err := os.Open(c.File)
	if err != nil {
		return fmt.Errorf("--price-file: %w", err)
	}
	defer f.Close()
	if st, err := f.Stat(); err != nil || st.IsDir() {
		return fmt.Errorf("--price-file %s: not a readable file", c.File)
	}
	return nil
}

// providers are the configured providers, in the order given.
func (c PriceConfig) providers() []prices.Provider {
	var out []prices.Provider
	for _, n := range c.providerNames() {
		switch n {
		case "vastai":
			out = append(out, &prices.VastAI{BaseURL: c.VastAIURL, APIKey: c.VastAIKey})
		case "lambda":
			out = append(out, &prices.Lambda{BaseURL: c.LambdaURL, APIKey: c.LambdaKey})
		case "runpod":
			out = append(out, &prices.RunPod{URL: c.RunPodURL, APIKey: c.RunPodKey})
		case "azure":
			out = append(out, &prices.Azure{BaseURL: c.AzureURL, Regions: c.AzureRegions})
		case "file":
			out = append(out, &prices.File{Path: c.File})
		}
	}
	return out
}

// Budgets returns the budget manager (budget use for metrics), nil before
// Start.
func (s *Server) Budgets() *budget.Manager {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.budgets
}

// Prices returns the price watcher (the cost model's price catalog), nil
// before Start.
func (s *Server) Prices() *pricewatch.Watcher {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.prices
}
