// Package server wires the collector: the store, the ingest and query gRPC
// services, gRPC health and server reflection, on one listener.
//
// Lifecycle: New keeps the config; Start opens the store, binds the
// listener and returns once the collector accepts connections; Shutdown
// (safe more than once, and without a Start) ends agent streams, stops gRPC
// gracefully and closes the store.
package server

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"

	"github.com/trainmeter/trainmeter/collector/internal/advice/dataloadersvc"
	"github.com/trainmeter/trainmeter/collector/internal/advice/recommendsvc"
	"github.com/trainmeter/trainmeter/collector/internal/aggregate"
	"github.com/trainmeter/trainmeter/collector/internal/alert"
	"github.com/trainmeter/trainmeter/collector/internal/auth"
	"github.com/trainmeter/trainmeter/collector/internal/budget"
	"github.com/trainmeter/trainmeter/collector/internal/console"
	"github.com/trainmeter/trainmeter/collector/internal/fold"
	"github.com/trainmeter/trainmeter/collector/internal/ingest"
	"github.com/trainmeter/trainmeter/collector/internal/leader"
	"github.com/trainmeter/trainmeter/collector/internal/pgstore"
	"github.com/trainmeter/trainmeter/collector/internal/pricing/carbonwatch"
	"github.com/trainmeter/trainmeter/collector/internal/pricing/cost"
	"github.com/trainmeter/trainmeter/collector/internal/pricing/pricewatch"
	"github.com/trainmeter/trainmeter/collector/internal/query"
	"github.com/trainmeter/trainmeter/collector/internal/storage"
	"github.com/trainmeter/trainmeter/collector/internal/store"
	"github.com/trainmeter/trainmeter/collector/internal/telemetry"
	"github.com/trainmeter/trainmeter/internal/flowcontrol"
	"github.com/trainmeter/trainmeter/internal/lifecycle"
	"github.com/trainmeter/trainmeter/pkg/clock"
	"github.com/trainmeter/trainmeter/pkg/otelexport"
	"github.com/trainmeter/trainmeter/pkg/tlsfiles"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// MaxRecvMsgSize is the largest message the collector accepts.
const MaxRecvMsgSize = 16 << 20

// DefaultListen is the default listen address.
const DefaultListen = "127.0.0.1:7433"

// DefaultCommitWindow is `serve --commit-window`'s default: at 1,000 agents
// a window halves the collector's CPU per batch for up to the window more
// ack latency, which an agent keeping each batch in its spool until acked
// does not notice (docs/benchmarks.md).
const DefaultCommitWindow = 100 * time.Millisecond

// DefaultPostgresCommitWindow is its default with --store (PostgreSQL): a
// group's statements cost about the same whatever its size, so a few
// batches more per group matter most at moderate load, where a short
// window gathers them; a long one adds ack latency the group's own
// round trips already add to (docs/benchmarks.md, "Commit window on
// PostgreSQL").
const DefaultPostgresCommitWindow = 20 * time.Millisecond

// Defaults of `serve --max-live-runs-per-node` and
// `--max-new-runs-per-minute`: far above a real node, low enough that one
// node's token cannot fill the collector's memory with runs.
const (
	DefaultMaxLiveRunsPerNode  = 256
	DefaultMaxNewRunsPerMinute = 600
)

// Config is the collector's configuration.
type Config struct {
	// Listen is the host:port to listen on (port 0 picks a free one).
	Listen string
	// DataDir is the badger directory (when StoreURL is empty).
	DataDir string
	// StoreURL, when set, is the PostgreSQL database (postgres://…) the
	// collector keeps its data in instead, shared with other collectors;
	// StorePasswordFile holds its password when the URL has none.
	StoreURL, StorePasswordFile string
	// GPUPricePerHour is the default $/GPU-hour for runs whose run_start has
	// no price; 0 = unknown.
	GPUPricePerHour float64
	// EnergyPricePerKWh is the flat energy tariff; 0 = unknown.
	EnergyPricePerKWh float64
	// GridGCO2PerKWh is the grid carbon intensity; 0 = unknown. With a
	// carbon source it is the fallback for energy the source does not cover.
	GridGCO2PerKWh float64
	// Carbon is the carbon intensity by the hour (docs/costs.md, "CO2").
	Carbon CarbonConfig
	// Tariff is a time-of-use energy tariff (instead of EnergyPricePerKWh);
	// EnergyIncluded says the GPU price includes power. NodeGPUPricePerHour,
	// PriceCatalog and PriorityMultipliers: see cost.Config.
	Tariff              *cost.Tariff
	EnergyIncluded      bool
	NodeGPUPricePerHour map[string]float64
	PriceCatalog        cost.PriceCatalog
	// OwnedHardware prices owned GPUs from their purchase; PUE multiplies
	// energy for its cost and CO2 (0: 1). See cost.Config.
	OwnedHardware       *cost.OwnedHardware
	PUE                 float64
	PriorityMultipliers map[string]float64
	// GCInterval is how often value-log GC runs; 0 disables it.
	GCInterval time.Duration
	// RawRetention and CommitWindow: see store.Options.
	RawRetention, CommitWindow time.Duration
	// Bounds per node (docs/security.md; fold.Limits,
	// ingest.DefaultMaxBatchRunRecords); 0: none, and the ingest default.
	MaxLiveRunsPerNode, MaxNewRunsPerMinute, MaxBatchRunRecords int
	// StatusListen, when set (HOST:PORT), serves GET /healthz and GET /status
	// over plain HTTP (docs/observability.md).
	StatusListen string

	// TLS: the server certificate and key, and optionally a client CA
	// bundle (mTLS: a client certificate signed by it is required). Files
	// are re-read when they change. Empty: plaintext.
	TLSCertFile, TLSKeyFile, TLSClientCAFile string
	// Token files (see package auth); empty: that check is off.
	IngestTokensFile, ReadTokenFile, AdminTokenFile string

	// Budget: budgets; Alerts: where their alerts (and price alerts) go;
	// Prices: the GPU price provider (budget.go).
	Budget BudgetConfig
	Alerts AlertConfig
	Prices PriceConfig
	// Clock of every part of the collector (Alerts.Webhook.Clock overrides
	// it for webhooks); nil: the wall clock.
	Clock clock.Clock
	// OTel is the OpenTelemetry export (OTLP push, Prometheus /metrics);
	// the zero value exports nothing (docs/otel.md).
	OTel otelexport.Config
	// PrometheusRunMetrics shows the run-level series of /metrics (run
	// ids, models, budget scopes: telemetry.PrivateAttributes) to every
	// scrape. Off (default): only scrapes with the read or admin token
	// (Authorization: Bearer) see them; node-level series are open.
	PrometheusRunMetrics bool

	// --- web console (console.go, docs/console.md) ---
	// UIListen is the web console's HOST:PORT; empty: no console.
	UIListen string
	// UIListenDefault says UIListen is the default, not asked for: one that
	// cannot be bound leaves the collector without a console (startConsole).
	UIListenDefault bool
}

// CarbonConfig is where the grid's carbon intensity by the hour comes
// from, and which zone each node draws from.
type CarbonConfig struct {
	// File: intensity by weekday and time of day per zone; nil: none.
	File *cost.CarbonFile
	// API: the live ElectricityMaps-shaped source (BaseURL "" = none); its
	// Zones are filled from Zone and NodeZones. Asked first; the file
	// covers the hours it lacks, then --grid-gco2-kwh.
	API carbonwatch.Config
	// Zone of every node not in NodeZones ("" = the file's only zone).
	Zone      string
	NodeZones map[string]string
}

// liveZones are the zones the live source is asked for: every zone a
// node can be in (the default zone is the file's only zone when not given).
func (c CarbonConfig) liveZones() []string {
	set := map[string]bool{}
	switch {
	case c.Zone != "":
		set[c.Zone] = true
	case c.File != nil && len(c.File.Zones) == 1:
		set[c.File.ZoneNames()[0]] = true
	}
	for _, z := range c.NodeZones {
		set[z] = true
	}
	return slices.Sorted(maps.Keys(set))
}

// liveAPI is API asked for liveZones.
func (c CarbonConfig) liveAPI() carbonwatch.Config {
	api := c.API
	api.Zones = c.liveZones()
	return api
}

// TLSOptions returns the TLS file settings.
func (c Config) TLSOptions() tlsfiles.ServerOptions {
	return tlsfiles.ServerOptions{CertFile: c.TLSCertFile, KeyFile: c.TLSKeyFile, ClientCAFile: c.TLSClientCAFile}
}

// AuthConfig returns the token file settings.
func (c Config) AuthConfig() auth.Config {
	return auth.Config{IngestTokensFile: c.IngestTokensFile, ReadTokenFile: c.ReadTokenFile, AdminTokenFile: c.AdminTokenFile}
}

// Validate checks the configuration.
func (c Config) Validate() error {
	var errs []error
	if c.Listen == "" {
		errs = append(errs, errors.New("listen address is empty"))
	} else if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		errs = append(errs, fmt.Errorf("listen address %q: %v", c.Listen, err))
	}
	if c.StoreURL != "" {
		errs = append(errs, checkStoreURL(c.StoreURL))
	} else if c.DataDir == "" {
		errs = append(errs, errors.New("data directory is empty"))
	}
	errs = append(errs, c.Pricing().Validate())
	if c.Carbon.API.Enabled() {
		errs = append(errs, c.Carbon.liveAPI().Validate())
	}
	if c.GCInterval < 0 {
		errs = append(errs, fmt.Errorf("gc interval must be >= 0, got %v", c.GCInterval))
	}
	if c.CommitWindow < 0 || c.CommitWindow > time.Second {
		errs = append(errs, fmt.Errorf("commit window must be between 0 and 1s, got %v", c.CommitWindow))
	}
	if c.MaxLiveRunsPerNode < 0 || c.MaxNewRunsPerMinute < 0 || c.MaxBatchRunRecords < 0 {
		errs = append(errs, fmt.Errorf("per-node limits must be >= 0 (live runs %d, new runs a minute %d, run records a batch %d)",
			c.MaxLiveRunsPerNode, c.MaxNewRunsPerMinute, c.MaxBatchRunRecords))
	}
	if c.RawRetention < 0 {
		errs = append(errs, fmt.Errorf("raw retention must be >= 0, got %v", c.RawRetention))
	}
	// errors.Join leaves out the nil ones.
	errs = append(errs, c.TLSOptions().Validate(), c.Budget.Validate(), c.Alerts.Validate(), c.Prices.Validate(), c.OTel.Validate(), c.validateUI())
	return errors.Join(errs...)
}

// Pricing returns the cost settings for reports. A live carbon source is
// only known once the collector runs (pricingWith); here it answers for no
// hour.
func (c Config) Pricing() aggregate.Pricing { return c.pricingWith(nil) }

func (c Config) pricingWith(live cost.CarbonSource) aggregate.Pricing {
	p := aggregate.Pricing{
		GPUPricePerHour: c.GPUPricePerHour, EnergyPricePerKWh: c.EnergyPricePerKWh, GridGCO2PerKWh: c.GridGCO2PerKWh,
		Tariff: c.Tariff, EnergyIncluded: c.EnergyIncluded, NodeGPUPricePerHour: c.NodeGPUPricePerHour,
		Catalog: c.PriceCatalog, PriorityMultipliers: c.PriorityMultipliers,
		Owned: c.OwnedHardware, PUE: c.PUE,
		CarbonFile: c.Carbon.File, CarbonZone: c.Carbon.Zone, CarbonNodeZones: c.Carbon.NodeZones,
		CarbonLive: c.Carbon.API.Enabled(),
	}
	var chain cost.CarbonChain
	if live != nil {
		chain = append(chain, live)
	}
	if c.Carbon.File != nil {
		chain = append(chain, c.Carbon.File)
	}
	if c.Carbon.API.Enabled() || c.Carbon.File != nil {
		p.Carbon = chain
	}
	return p
}

// storeOptions: with a raw retention, dedup marks are kept a day longer than
// the oldest batch ingest accepts, so no replay can be applied twice.
func (s *Server) storeOptions(pricing aggregate.Pricing) store.Options {
	o := store.Options{Logger: s.log, RawRetention: s.cfg.RawRetention, CommitWindow: s.cfg.CommitWindow, Clock: s.cfg.Clock,
		Limits: s.limits()}
	if pricing.Carbon != nil {
		o.Carbon = pricing
	}
	if s.cfg.Tariff != nil {
		o.EnergyBands = s.cfg.Tariff
	}
	if s.cfg.RawRetention > 0 {
		o.DedupRetention = ingest.MaxBatchAge + 24*time.Hour
	}
	return o
}

// limits are the per-node bounds on runs, for either store.
func (s *Server) limits() fold.Limits {
	return fold.Limits{MaxLiveRunsPerNode: s.cfg.MaxLiveRunsPerNode, MaxNewRunsPerMinute: s.cfg.MaxNewRunsPerMinute}
}

// checkStoreURL checks that a store URL names PostgreSQL.
func checkStoreURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("store URL %s does not parse", pgstore.Redact(raw))
	}
	if u.Scheme != "postgres" && u.Scheme != "postgresql" {
		return fmt.Errorf("store URL %s: the scheme must be postgres:// (PostgreSQL); a data directory is --data", pgstore.Redact(raw))
	}
	return nil
}

// collectorStore is the store the server opens: the seam its services use,
// and what the server itself does with it.
type collectorStore interface {
	storage.Store
	SetPricer(aggregate.Pricer)
	Close() error
}

// leaderLock is the fleet's leader lock of a store that collectors share
// (nil: the one collector on its store leads).
func leaderLock(st collectorStore) leader.Lock {
	if pg, ok := st.(*pgstore.Store); ok {
		return pg.LeaderLock()
	}
	return nil
}

// CatalogReload is how often a collector that does not lead its fleet
// reads the price catalogs and carbon intensities the leader fetched.
const CatalogReload = 30 * time.Second

// schedule is a job on a schedule, as a component.
type schedule struct {
	p     *lifecycle.Periodic
	clk   clock.Clock
	every time.Duration
	job   func(context.Context)
}

func (c schedule) Start(context.Context) error        { c.p.Start(c.clk, c.every, c.job); return nil }
func (c schedule) Shutdown(ctx context.Context) error { return c.p.Shutdown(ctx) }

// openStore opens the store the configuration names, by the URL's scheme
// (PostgreSQL) or else the data directory (BadgerDB), and the background
// loop it needs (nil: none).
func (s *Server) openStore(ctx context.Context, pricing aggregate.Pricing) (collectorStore, lifecycle.Component, error) {
	if s.cfg.StoreURL == "" {
		st, err := store.Open(s.cfg.DataDir, s.storeOptions(pricing))
		if err != nil {
			return nil, nil, err
		}
		return st, &store.GC{Store: st, Interval: s.cfg.GCInterval, Clock: s.cfg.Clock}, nil
	}
	so := s.storeOptions(pricing)
	o := pgstore.Options{Logger: s.log, Clock: s.cfg.Clock, PasswordFile: s.cfg.StorePasswordFile, Limits: s.limits(),
		RawRetention: so.RawRetention, DedupRetention: so.DedupRetention, CommitWindow: s.cfg.CommitWindow}
	if pricing.Carbon != nil {
		o.Carbon = pricing
	}
	if s.cfg.Tariff != nil {
		o.EnergyBands = s.cfg.Tariff
	}
	st, err := pgstore.Open(ctx, s.cfg.StoreURL, o)
	if err != nil {
		return nil, nil, err
	}
	// Every replica maintains the partitions (idempotent, under an
	// advisory lock); the leader alone is enough.
	return st, &pgstore.Maintainer{Store: st}, nil
}

// Server is a collector.
type Server struct {
	cfg Config
	log *slog.Logger

	mu       sync.Mutex
	started  bool
	store    collectorStore
	ingest   *ingest.Server
	advisor  *dataloadersvc.Advisor
	loops    []lifecycle.Component // started background loops, in start order
	budgets  *budget.Manager
	webhooks *alert.Webhooks
	prices   *pricewatch.Watcher
	carbon   *carbonwatch.Watcher // nil without a live carbon source
	elector  *leader.Elector
	grpc     *grpc.Server
	health   *health.Server
	lis      net.Listener
	served   chan struct{}
	stopped  bool

	// Self-observability (status.go).
	startedAt   time.Time
	statusLn    net.Listener
	statusSrv   *http.Server
	summaryStop chan struct{}

	telemetry *telemetry.Telemetry // nil when OTel export is off
	ui        *console.Console     // nil when the console is off
}

// New returns a collector with cfg. A nil log discards the collector's
// logs (as everywhere in both daemons: see package lifecycle).
func New(cfg Config, log *slog.Logger) *Server {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	cfg.Clock = cmp.Or[clock.Clock](cfg.Clock, clock.Real{})
	return &Server{cfg: cfg, log: log}
}

// Start validates the config, opens the store, listens and serves. The
// parts are built in the order they depend on each other, each once; what
// was started is undone, newest first, if a later step fails.
func (s *Server) Start(ctx context.Context) (err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.started {
		return errors.New("collector already started")
	}
	if err := s.cfg.Validate(); err != nil {
		return fmt.Errorf("config: %w", err)
	}
	if err := s.cfg.Prices.checkFiles(); err != nil {
		return fmt.Errorf("config: %w", err)
	}
	var undo []func()
	defer func() {
		if err != nil {
			for i := len(undo) - 1; i >= 0; i-- {
				undo[i]()
			}
		}
	}()

	// The live carbon source books energy as it is stored, so it exists
	// before the store; it keeps its hours in the store once that is open.
	var carbon *carbonwatch.Watcher
	if s.cfg.Carbon.API.Enabled() {
		api := s.cfg.Carbon.liveAPI()
		if api.Clock == nil {
			api.Clock = s.cfg.Clock
		}
		carbon = carbonwatch.New(api, s.log)
	}
	var live cost.CarbonSource
	if carbon != nil {
		live = carbon
	}
	pricing := s.cfg.pricingWith(live)
	st, gc, err := s.openStore(ctx, pricing)
	if err != nil {
		return err
	}
	undo = append(undo, func() { st.Close() })
	if carbon != nil {
		if err := carbon.SetStore(st); err != nil {
			s.log.Warn("cannot read the stored carbon intensities; the live carbon source has none until the next fetch or reload", "err", err)
		}
	}
	opts, authz, err := s.securityOptions()
	if err != nil {
		return err
	}
	var lc net.ListenConfig
	lis, err := lc.Listen(ctx, "tcp", s.cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", s.cfg.Listen, err)
	}
	undo = append(undo, func() { lis.Close() })
	ing := ingest.New(st, s.log)
	ing.SetClock(s.cfg.Clock)
	ing.SetMaxBatchRunRecords(s.cfg.MaxBatchRunRecords)

	var exp *otelexport.Exporter
	if s.cfg.OTel.Enabled() {
		res := otelexport.Resource{ServiceName: "trainmeter-collector", InstanceID: instanceID(lis.Addr())}
		if exp, err = otelexport.Start(ctx, s.otelConfig(authz), res, s.log); err != nil {
			return fmt.Errorf("otel export: %w", err)
		}
		undo = append(undo, func() { _ = exp.Shutdown(ctx) })
	}

	// The fleet-wide work runs on the leader of the collectors sharing the
	// store (package leader): webhook delivery and scheduled price and
	// carbon fetches are its tasks, budget alerts ask it. The others read
	// the fetched catalogs and intensities the leader stored. Every collector records alerts
	// (once, by the store) and sends advisories to the agents it holds.
	lock := leaderLock(st)
	webhookCfg := s.cfg.Alerts.Webhook
	if webhookCfg.Clock == nil {
		webhookCfg.Clock = s.cfg.Clock
	}
	if lock != nil {
		webhookCfg.Rescan = leader.DefaultRetry
	}
	webhooks := alert.NewWebhooks(webhookCfg, st, s.log)
	sinks := append(alert.Sinks{webhooks}, s.cfg.Alerts.Sinks...)
	if exp != nil {
		sinks = append(sinks, otelAlerts{telemetry.NewAlertLog(exp, s.cfg.Clock)})
	}
	prices := pricewatch.New(pricewatch.Config{Interval: s.cfg.Prices.FetchInterval, MaxOfferAge: s.cfg.Prices.MaxOfferAge, Clock: s.cfg.Clock}, s.cfg.Prices.providers(), st,
		&alert.Recorder{Store: st, Sink: sinks}, s.log)
	if pricing.Catalog == nil {
		// Without a configured catalog, the collector's own GPU price
		// history is the catalog.
		pricing.Catalog = prices
	}
	// Windows are booked at the prices in force when they are stored
	// (docs/costs.md, "Locked prices"); ingest is not served yet.
	st.SetPricer(pricing)
	loc, _ := time.LoadLocation(s.cfg.Budget.Timezone) // checked by Validate
	report := func(a *aggregate.State) *trainmeterv1.RunReport { return a.Report(pricing) }
	tasks := []leader.Task{webhooks, prices}
	if pg, ok := st.(*pgstore.Store); ok {
		// The minute rollups and daily usage of what ingest stored
		// (docs/storage.md, "Rollups behind ingest").
		tasks = append(tasks, &pgstore.Roller{Store: pg})
	}
	if carbon != nil {
		tasks = append(tasks, carbon)
	}
	elector := leader.New(leader.Config{Lock: lock, Clock: s.cfg.Clock, Logger: s.log, Tasks: tasks})
	budgetCfg := budget.Config{EvalInterval: s.cfg.Budget.EvalInterval, Location: loc, Clock: s.cfg.Clock}
	if lock != nil {
		budgetCfg.Leader = elector.Leading
	}
	budgets := budget.New(budgetCfg, st, report, ing, sinks, s.log)
	budgets.SetPricing(pricing)
	adv := dataloadersvc.New(st, ing, s.log)

	var tel *telemetry.Telemetry
	if exp != nil {
		o := telemetry.Options{Exporter: exp, Runs: st, Nodes: ing, Pricing: pricing, Clock: s.cfg.Clock, Logger: s.log,
			Budgets: budgetUse{budgets}, Recommendations: adv}
		if rr, ok := st.(telemetry.RecentRuns); ok && lock != nil {
			// Replicas on one store: the fleet's run series, from its leader.
			o.Fleet = &telemetry.Fleet{Leading: elector.Leading, Runs: rr}
		}
		tel, err = telemetry.New(o)
		if err != nil {
			return fmt.Errorf("otel export: %w", err)
		}
		ing.OnApplied(tel.OnApplied)
	}
	ing.OnApplied(adv.Observe)
	ing.OnApplied(budgets.OnApplied)
	qs := query.New(st, ing, pricing)
	qs.SetPlans(budgets)
	qs.SetLogger(s.log)

	// Fixed flow-control windows: no bandwidth-probing PING and window
	// update beside each agent's batch (package flowcontrol).
	gs := grpc.NewServer(append(append([]grpc.ServerOption{
		grpc.MaxRecvMsgSize(MaxRecvMsgSize),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
	}, flowcontrol.ServerOptions()...), opts...)...)
	trainmeterv1.RegisterIngestServiceServer(gs, ing)
	trainmeterv1.RegisterQueryServiceServer(gs, qs)
	services := console.Services{Query: qs, Recommend: recommendsvc.NewService(st, pricing, pricing.Catalog),
		Budgets: budget.NewService(budgets), Prices: pricewatch.NewService(prices)}
	trainmeterv1.RegisterRecommendServiceServer(gs, services.Recommend)
	trainmeterv1.RegisterBudgetServiceServer(gs, services.Budgets)
	trainmeterv1.RegisterPriceServiceServer(gs, services.Prices)
	hs := health.NewServer()
	healthpb.RegisterHealthServer(gs, hs)
	for _, name := range []string{"", trainmeterv1.IngestService_ServiceDesc.ServiceName, trainmeterv1.QueryService_ServiceDesc.ServiceName, trainmeterv1.RecommendService_ServiceDesc.ServiceName} {
		hs.SetServingStatus(name, healthpb.HealthCheckResponse_SERVING)
	}
	reflection.Register(gs)

	// Background loops; Shutdown stops them newest first.
	var loops []lifecycle.Component
	components := []lifecycle.Component{adv, budgets}
	if gc != nil {
		components = append([]lifecycle.Component{gc}, components...)
	}
	if lock != nil {
		components = append(components, schedule{p: lifecycle.NewPeriodic("leader's fetches reload"), clk: s.cfg.Clock, every: CatalogReload,
			job: func(context.Context) {
				if elector.Leading() {
					return
				}
				prices.Reload()
				if carbon != nil {
					if err := carbon.Reload(); err != nil {
						s.log.Warn("cannot reload the stored carbon intensities", "err", err)
					}
				}
			}})
	}
	components = append(components, elector)
	ui, err := s.newConsole(authz, services)
	if err != nil {
		return err
	}
	for _, c := range components {
		if err := c.Start(ctx); err != nil {
			return err
		}
		loops = append(loops, c)
		undo = append(undo, func() { _ = c.Shutdown(context.Background()) })
	}
	if ui, err = s.startConsole(ctx, ui); err != nil {
		return err
	}
	if ui != nil {
		loops = append(loops, ui)
		undo = append(undo, func() { _ = ui.Shutdown(context.Background()) })
	}
	if err := s.startStatus(); err != nil {
		return err
	}
	s.summaryStop = make(chan struct{})
	go s.logSummary(time.Minute, s.summaryStop)
	s.store, s.ingest, s.grpc, s.health, s.lis = st, ing, gs, hs, lis
	s.advisor, s.budgets, s.webhooks, s.prices, s.telemetry, s.loops = adv, budgets, webhooks, prices, tel, loops
	s.carbon, s.elector = carbon, elector
	s.ui = ui
	s.served = make(chan struct{})
	s.started = true
	go func() {
		defer close(s.served)
		if err := gs.Serve(lis); err != nil {
			s.log.Error("grpc serve", "err", err)
		}
	}()
	where := []any{"data", s.cfg.DataDir}
	if s.cfg.StoreURL != "" {
		where = []any{"store", pgstore.Redact(s.cfg.StoreURL)}
	}
	s.log.Info("listening on "+lis.Addr().String(), append(append([]any{"addr", lis.Addr().String()}, where...),
		"tls", s.cfg.TLSOptions().Enabled(), "mtls", s.cfg.TLSClientCAFile != "", "tokens", s.cfg.AuthConfig().Enabled())...)
	if !s.cfg.TLSOptions().Enabled() && !isLoopback(lis.Addr()) {
		s.log.Warn("serving plaintext gRPC on a non-loopback address: data (and tokens) travel unencrypted; set --tls-cert and --tls-key", "addr", lis.Addr().String())
	}
	return nil
}

// otelConfig is the OTel export configuration with the /metrics gate:
// run-level series only for scrapes with the read or admin token, unless
// PrometheusRunMetrics opens them.
func (s *Server) otelConfig(a *auth.Auth) otelexport.Config {
	cfg := s.cfg.OTel
	if cfg.PrometheusListen == "" || s.cfg.PrometheusRunMetrics {
		return cfg
	}
	method := trainmeterv1.QueryService_ListRuns_FullMethodName
	cfg.PrometheusGate = &otelexport.PrometheusGate{
		PrivateAttributes: telemetry.PrivateAttributes,
		Authorized:        func(r *http.Request) bool { return a.ReadRequest(r, method) },
	}
	return cfg
}

// securityOptions builds the TLS credentials and the token interceptors;
// the token checker (nil without tokens) also guards the web console.
func (s *Server) securityOptions() ([]grpc.ServerOption, *auth.Auth, error) {
	var opts []grpc.ServerOption
	if s.cfg.TLSOptions().Enabled() {
		creds, err := tlsfiles.ServerCredentials(s.cfg.TLSOptions(), s.log)
		if err != nil {
			return nil, nil, err
		}
		opts = append(opts, grpc.Creds(creds))
	}
	var a *auth.Auth
	if s.cfg.AuthConfig().Enabled() {
		var err error
		if a, err = auth.New(s.cfg.AuthConfig(), s.log); err != nil {
			return nil, nil, err
		}
		opts = append(opts, grpc.ChainUnaryInterceptor(a.UnaryInterceptor()), grpc.ChainStreamInterceptor(a.StreamInterceptor()))
	}
	return opts, a, nil
}

func isLoopback(a net.Addr) bool {
	ta, ok := a.(*net.TCPAddr)
	return ok && ta.IP.IsLoopback()
}

// Addr returns the bound listen address (nil before Start).
func (s *Server) Addr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lis == nil {
		return nil
	}
	return s.lis.Addr()
}

// Ingest returns the ingest server (for advisories), nil before Start.
func (s *Server) Ingest() *ingest.Server {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ingest
}

// Telemetry returns the OTel export (nil when off or before Start), where
// budget and recommendation sources are plugged in and alerts are emitted.
func (s *Server) Telemetry() *telemetry.Telemetry {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.telemetry
}

// instanceID is service.instance.id: host and listen address, stable across
// restarts so that a restarted collector continues the same series.
func instanceID(addr net.Addr) string {
	host, _ := os.Hostname()
	return host + "/" + addr.String()
}

// Shutdown stops the collector: agent streams end with Unavailable (they
// reconnect and resend unacked batches), in-flight calls finish unless ctx
// expires first, then the store is closed.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.started || s.stopped {
		return nil
	}
	s.stopped = true
	s.health.Shutdown()
	s.ingest.Close()
	done := make(chan struct{})
	go func() {
		s.grpc.GracefulStop()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		s.log.Warn("graceful stop timed out; stopping hard")
		s.grpc.Stop()
		<-done
	}
	<-s.served
	for i := len(s.loops) - 1; i >= 0; i-- {
		if err := s.loops[i].Shutdown(ctx); err != nil {
			s.log.Warn("shutdown", "err", err)
		}
	}
	close(s.summaryStop)
	s.stopStatus()
	// The last export reads the run aggregates: before the store closes.
	if err := s.telemetry.Shutdown(ctx); err != nil {
		s.log.Warn("otel export shutdown", "err", err)
	}
	if err := s.store.Close(); err != nil {
		return fmt.Errorf("close store: %w", err)
	}
	s.log.Info("collector stopped")
	return nil
}
