package server

import (
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"

	"github.com/trainmeter/trainmeter/collector/internal/aggregate"
	"github.com/trainmeter/trainmeter/collector/internal/budget"
	"github.com/trainmeter/trainmeter/collector/internal/ingest"
	"github.com/trainmeter/trainmeter/collector/internal/pricewatch"
	"github.com/trainmeter/trainmeter/collector/internal/store"
	"github.com/trainmeter/trainmeter/pkg/clock"
	"github.com/trainmeter/trainmeter/pkg/prices"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// BudgetConfig configures budgets, alert delivery and GPU prices
// (docs/budgets.md).
type BudgetConfig struct {
	// Webhook delivery of alerts (URLs empty: none).
	Webhook budget.WebhookConfig
	// EvalInterval: how often budgets are evaluated after runs changed.
	EvalInterval time.Duration
	// Timezone of monthly budgets' calendar months (IANA name); "": UTC.
	Timezone string

	// PriceProvider: "" (none), "vastai" or "file".
	PriceProvider string
	// VastAIURL is the vast.ai API base URL ("": prices.DefaultVastAIURL);
	// VastAIKey its optional bearer key.
	VastAIURL, VastAIKey string
	// PriceFile is the CSV or JSON price list of the file provider.
	PriceFile string
	// PriceFetchInterval between scheduled fetches (the first at start); 0:
	// on demand only.
	PriceFetchInterval time.Duration

	// Clock of the budget and price loops; nil: the wall clock (tests).
	Clock clock.Clock
	// AlertSinks are told of every alert besides the webhooks (e.g. an
	// OpenTelemetry log exporter).
	AlertSinks []budget.AlertSink
}

// Validate checks the config.
func (c BudgetConfig) Validate() error {
	var errs []error
	if err := c.Webhook.Validate(); err != nil {
		errs = append(errs, err)
	}
	if c.EvalInterval < 0 {
		errs = append(errs, fmt.Errorf("budget evaluation interval must be >= 0, got %v", c.EvalInterval))
	}
	if _, err := time.LoadLocation(c.Timezone); err != nil {
		errs = append(errs, fmt.Errorf("budget timezone %q: %v", c.Timezone, err))
	}
	switch c.PriceProvider {
	case "", "vastai":
	case "file":
		if c.PriceFile == "" {
			errs = append(errs, errors.New("--price-provider file needs --price-file"))
		}
	default:
		errs = append(errs, fmt.Errorf("price provider %q: want vastai or file", c.PriceProvider))
	}
	if c.PriceFetchInterval < 0 {
		errs = append(errs, fmt.Errorf("price fetch interval must be >= 0, got %v", c.PriceFetchInterval))
	}
	return errors.Join(errs...)
}

// checkFiles checks, at start, that the files the config names can be
// read (Validate checks only the values): a missing price file would
// otherwise show only as failed fetches. The file provider re-reads the
// file at each fetch; what it holds is checked then.
func (c BudgetConfig) checkFiles() error {
	if c.PriceProvider != "file" {
		return nil
	}
	f, err := os.Open(c.PriceFile)
	if err != nil {
		return fmt.Errorf("--price-file: %w", err)
	}
	defer f.Close()
	if st, err := f.Stat(); err != nil || st.IsDir() {
		return fmt.Errorf("--price-file %s: not a readable file", c.PriceFile)
	}
	return nil
}

func (c BudgetConfig) provider() prices.Provider {
	switch c.PriceProvider {
	case "vastai":
		return &prices.VastAI{BaseURL: c.VastAIURL, APIKey: c.VastAIKey}
	case "file":
		return &prices.File{Path: c.PriceFile}
	}
	return nil
}

// budgetParts are the running budget and price components.
type budgetParts struct {
	webhooks *budget.Webhooks
	manager  *budget.Manager
	prices   *pricewatch.Watcher
}

// startBudget builds the budget manager, webhook sender and price watcher,
// registers their services, and starts their loops.
func (s *Server) startBudget(st *store.Store, ing *ingest.Server, gs *grpc.Server, pricing aggregate.Pricing, catalog *catalogRef, sinks []budget.AlertSink) *budgetParts {
	c := s.cfg.Budget
	loc, _ := time.LoadLocation(c.Timezone) // checked by Validate
	p := &budgetParts{webhooks: budget.NewWebhooks(c.Webhook, st, s.log)}
	report := func(a *aggregate.State) *trainmeterv1.RunReport { return a.Report(pricing) }
	p.manager = budget.New(budget.Config{EvalInterval: c.EvalInterval, Location: loc, Clock: c.Clock}, st, report, ing,
		append(append(budget.Sinks{p.webhooks}, c.AlertSinks...), sinks...), s.log)
	p.manager.SetPricing(pricing)
	p.prices = pricewatch.New(pricewatch.Config{Interval: c.PriceFetchInterval, Clock: c.Clock}, c.provider(), st, p.manager.Recorder(), s.log)
	if catalog != nil {
		catalog.set(p.prices)
	}
	ing.OnApplied(p.manager.OnApplied)
	trainmeterv1.RegisterBudgetServiceServer(gs, budget.NewService(p.manager))
	trainmeterv1.RegisterPriceServiceServer(gs, pricewatch.NewService(p.prices))
	p.webhooks.Start()
	p.manager.Start()
	p.prices.Start()
	return p
}

func (p *budgetParts) shutdown() {
	if p == nil {
		return
	}
	p.prices.Shutdown()
	p.manager.Shutdown()
	p.webhooks.Shutdown()
}

// Budgets returns the budget manager (budget use for metrics), nil before
// Start.
func (s *Server) Budgets() *budget.Manager {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.budget == nil {
		return nil
	}
	return s.budget.manager
}

// Prices returns the price watcher (the cost model's price catalog), nil
// before Start.
func (s *Server) Prices() *pricewatch.Watcher {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.budget == nil {
		return nil
	}
	return s.budget.prices
}

// catalogRef is the price catalog handed to the cost model before the price
// watcher that backs it exists (the watcher needs the budget manager, which
// needs the pricing). Until set it knows no price.
type catalogRef struct {
	w atomic.Pointer[pricewatch.Watcher]
}

func (c *catalogRef) set(w *pricewatch.Watcher) { c.w.Store(w) }

// CurrentPrice implements cost.PriceCatalog.
func (c *catalogRef) CurrentPrice(gpuName string) (float64, bool) {
	if w := c.w.Load(); w != nil {
		return w.CurrentPrice(gpuName)
	}
	return 0, false
}
