package server

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/trainmeter/trainmeter/collector/internal/alert"
	"github.com/trainmeter/trainmeter/collector/internal/budget"
	"github.com/trainmeter/trainmeter/collector/internal/pricewatch"
	"github.com/trainmeter/trainmeter/pkg/prices"
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
	// Provider: "" (none), "vastai" or "file".
	Provider string
	// VastAIURL is the vast.ai API base URL ("": prices.DefaultVastAIURL);
	// VastAIKey its optional bearer key.
	VastAIURL, VastAIKey string
	// File is the CSV or JSON price list of the file provider.
	File string
	// FetchInterval between scheduled fetches (the first at start); 0: on
	// demand only.
	FetchInterval time.Duration
}

// Validate checks the config.
func (c PriceConfig) Validate() error {
	var errs []error
	switch c.Provider {
	case "", "vastai":
	case "file":
		if c.File == "" {
			errs = append(errs, errors.New("--price-provider file needs --price-file"))
		}
	default:
		errs = append(errs, fmt.Errorf("price provider %q: want vastai or file", c.Provider))
	}
	if c.FetchInterval < 0 {
		errs = append(errs, fmt.Errorf("price fetch interval must be >= 0, got %v", c.FetchInterval))
	}
	return errors.Join(errs...)
}

// checkFiles checks, at start, that the files the config names can be
// read (Validate checks only the values): a missing price file would
// otherwise show only as failed fetches. The file provider re-reads the
// file at each fetch; what it holds is checked then.
func (c PriceConfig) checkFiles() error {
	if c.Provider != "file" {
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

func (c PriceConfig) provider() prices.Provider {
	switch c.Provider {
	case "vastai":
		return &prices.VastAI{BaseURL: c.VastAIURL, APIKey: c.VastAIKey}
	case "file":
		return &prices.File{Path: c.File}
	}
	return nil
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
