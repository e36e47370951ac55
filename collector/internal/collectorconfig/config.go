// Package collectorconfig is `trainmeter serve`'s configuration: the
// sections of collector.yaml, their defaults and validation, the flags that
// override them, and the mapping onto server.Config (docs/config.md lists
// every key). Each section validates its own values; the server's own
// Validate then checks what spans sections (a console on the query port,
// pricing against the carbon file).
package collectorconfig

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/url"
	"os"
	"reflect"
	"regexp"
	"slices"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/trainmeter/trainmeter/collector/internal/alert"
	"github.com/trainmeter/trainmeter/collector/internal/ingest"
	"github.com/trainmeter/trainmeter/collector/internal/pricing/carbonwatch"
	"github.com/trainmeter/trainmeter/collector/internal/pricing/pricewatch"
	"github.com/trainmeter/trainmeter/collector/internal/server"
	"github.com/trainmeter/trainmeter/pkg/otelexport"
	"github.com/trainmeter/trainmeter/pkg/tlsfiles"
)

// Config is collector.yaml: one struct per section.
type Config struct {
	Server  Server  `yaml:"server"`
	TLS     TLS     `yaml:"tls"`
	Auth    Auth    `yaml:"auth"`
	Store   Store   `yaml:"store"`
	Limits  Limits  `yaml:"limits"`
	Pricing Pricing `yaml:"pricing"`
	Carbon  Carbon  `yaml:"carbon"`
	Prices  Prices  `yaml:"prices"`
	Budgets Budgets `yaml:"budgets"`
	Alerts  Alerts  `yaml:"alerts"`
	OTel    OTel    `yaml:"otel"`
	Console Console `yaml:"console"`
}

// Server is the process: the gRPC address, health, logs, memory, shutdown.
type Server struct {
	Listen          string        `yaml:"listen"`
	StatusListen    string        `yaml:"status_listen"`
	LogLevel        string        `yaml:"log_level"`
	ShutdownTimeout time.Duration `yaml:"shutdown_timeout"`
	// MemoryLimitMiB is the Go heap's soft limit (0: none; GOMEMLIMIT wins).
	MemoryLimitMiB int64 `yaml:"memory_limit_mib"`
}

// TLS is the server certificate, its key, and the CA of client
// certificates (mTLS); empty: plaintext.
type TLS struct {
	Cert     string `yaml:"cert"`
	Key      string `yaml:"key"`
	ClientCA string `yaml:"client_ca"`
}

// Auth names the token files (docs/security.md); empty: that check is off.
type Auth struct {
	IngestTokens   string `yaml:"ingest_tokens"`
	ReadTokenFile  string `yaml:"read_token_file"`
	AdminTokenFile string `yaml:"admin_token_file"`
}

// Store is the database and what it keeps.
type Store struct {
	Data string `yaml:"data"`
	// URL, when set, is a PostgreSQL database (postgres://…) shared with
	// other collectors, instead of Data; PasswordFile holds its password
	// when the URL has none.
	URL          string        `yaml:"url"`
	PasswordFile string        `yaml:"password_file"`
	GCInterval   time.Duration `yaml:"gc_interval"`
	// CommitWindow: how long a batch waits for others to share its
	// commit; unset: the store's default (server.DefaultCommitWindow on
	// BadgerDB, server.DefaultPostgresCommitWindow on PostgreSQL).
	CommitWindow *time.Duration `yaml:"commit_window"`
	RawRetention time.Duration  `yaml:"raw_retention"`
}

// Limits bound what one node may do (docs/security.md).
type Limits struct {
	MaxLiveRunsPerNode  int `yaml:"max_live_runs_per_node"`
	MaxNewRunsPerMinute int `yaml:"max_new_runs_per_minute"`
	MaxBatchRunRecords  int `yaml:"max_batch_run_records"`
}

// Pricing is the cost model (docs/costs.md); 0 is unknown. Tariff and
// OwnedHardware name YAML files.
type Pricing struct {
	GPUPricePerHour    float64            `yaml:"gpu_price_per_hour"`
	EnergyPriceKWh     float64            `yaml:"energy_price_kwh"`
	EnergyIncluded     bool               `yaml:"energy_included"`
	Tariff             string             `yaml:"tariff"`
	OwnedHardware      string             `yaml:"owned_hardware"`
	PUE                float64            `yaml:"pue"`
	NodeGPUPrice       map[string]float64 `yaml:"node_gpu_price"`
	PriorityMultiplier map[string]float64 `yaml:"priority_multiplier"`
}

// Carbon is the grid's carbon intensity (docs/costs.md, "CO2"): a flat
// figure, a file by the hour, a live API.
type Carbon struct {
	GridGCO2KWh   float64           `yaml:"grid_gco2_kwh"`
	File          string            `yaml:"file"`
	API           string            `yaml:"api"`
	APITokenFile  string            `yaml:"api_token_file"`
	FetchInterval time.Duration     `yaml:"fetch_interval"`
	Zone          string            `yaml:"zone"`
	NodeZones     map[string]string `yaml:"node_zones"`
}

// Prices is where GPU prices come from (docs/budgets.md). A key file
// left empty falls back to its environment variable.
type Prices struct {
	Providers     []string      `yaml:"providers"`
	VastAIURL     string        `yaml:"vastai_url"`
	VastAIKeyFile string        `yaml:"vastai_key_file"`
	LambdaURL     string        `yaml:"lambda_url"`
	LambdaKeyFile string        `yaml:"lambda_key_file"`
	RunPodURL     string        `yaml:"runpod_url"`
	RunPodKeyFile string        `yaml:"runpod_key_file"`
	AzureURL      string        `yaml:"azure_url"`
	AzureRegions  []string      `yaml:"azure_regions"`
	File          string        `yaml:"file"`
	FetchInterval time.Duration `yaml:"fetch_interval"`
	MaxAge        time.Duration `yaml:"max_age"`
}

// Budgets: how often they are evaluated, and the time zone of monthly ones.
type Budgets struct {
	EvalInterval time.Duration `yaml:"eval_interval"`
	Timezone     string        `yaml:"timezone"`
}

// Alerts are where alerts go besides the store: webhooks, given here or
// in files (one URL a line) that keep secrets in URLs out of this file.
type Alerts struct {
	Webhooks        []string `yaml:"webhooks"`
	WebhookURLFiles []string `yaml:"webhook_url_files"`
	WebhookRetries  int      `yaml:"webhook_retries"`
}

// OTel is the OpenTelemetry export, the agent's otel section's keys, plus
// who sees the run-level series of /metrics (docs/otel.md).
type OTel struct {
	otelexport.Config    `yaml:",inline"`
	PrometheusRunMetrics bool `yaml:"prometheus_run_metrics"`
}

// Console is the web console (docs/console.md); Listen "": off.
type Console struct {
	Listen string `yaml:"listen"`
}

// Default is what serve runs with when neither the file nor a flag says
// otherwise.
func Default() Config {
	return Config{
		Server:  Server{Listen: server.DefaultListen, LogLevel: "info", ShutdownTimeout: 10 * time.Second, MemoryLimitMiB: DefaultMemoryLimitMiB},
		Store:   Store{Data: "./trainmeter-data", GCInterval: 5 * time.Minute},
		Limits:  Limits{server.DefaultMaxLiveRunsPerNode, server.DefaultMaxNewRunsPerMinute, ingest.DefaultMaxBatchRunRecords},
		Carbon:  Carbon{FetchInterval: carbonwatch.DefaultInterval},
		Prices:  Prices{FetchInterval: time.Hour},
		Budgets: Budgets{EvalInterval: time.Second, Timezone: "UTC"},
		Alerts:  Alerts{WebhookRetries: 7},
		Console: Console{Listen: server.DefaultUIListen},
	}
}

// DefaultMemoryLimitMiB: without a limit the Go heap grows to twice its
// live data before a collection, which at 10,000 agents put the collector
// at 1.3–1.7 GiB resident for about 0.7 GiB of live data
// (docs/benchmarks.md).
const DefaultMemoryLimitMiB = 768

// Load reads the YAML file at path over c. An unknown key is refused by
// name and line (a typo must not leave a default in place silently); c
// keeps what the rest of the file set, so that a check reports every
// problem at once.
func Load(path string, c *Config) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	err = dec.Decode(c)
	var te *yaml.TypeError
	switch {
	case err == nil || errors.Is(err, io.EOF): // an empty file: the defaults
		return nil
	case errors.As(err, &te):
		errs := make([]error, len(te.Errors))
		for i, e := range te.Errors {
			errs[i] = fmt.Errorf("%s:%s", path, unknownKey(e))
		}
		return errors.Join(errs...)
	}
	return fmt.Errorf("config %s: %w", path, err)
}

var notFound = regexp.MustCompile(`^line (\d+): field (.+) not found in type (.+)$`)

// unknownKey words yaml.v3's "line N: field K not found in type T" with the
// section's name instead of the Go type's.
func unknownKey(e string) string {
	m := notFound.FindStringSubmatch(e)
	if m == nil {
		return " " + e
	}
	where := "at the top level"
	t := reflect.TypeOf(Config{})
	for i := range t.NumField() {
		if t.Field(i).Type.String() == m[3] {
			where = "in section " + t.Field(i).Tag.Get("yaml")
		}
	}
	return fmt.Sprintf("%s: unknown key %q %s", m[1], m[2], where)
}

// section is one section's name and its check.
type section struct {
	name string
	v    interface{ Validate() error }
}

func (c Config) sections() []section {
	return []section{{"server", c.Server}, {"tls", c.TLS}, {"auth", c.Auth}, {"store", c.Store}, {"limits", c.Limits},
		{"pricing", c.Pricing}, {"carbon", c.Carbon}, {"prices", c.Prices}, {"budgets", c.Budgets}, {"alerts", c.Alerts},
		{"otel", c.OTel}, {"console", c.Console}}
}

// Validate reports every section's problems, each prefixed with its section.
func (c Config) Validate() error {
	var errs []error
	for _, s := range c.sections() {
		err := s.v.Validate()
		if err == nil {
			continue
		}
		parts := []error{err}
		if j, ok := err.(interface{ Unwrap() []error }); ok {
			parts = j.Unwrap()
		}
		for _, e := range parts {
			errs = append(errs, fmt.Errorf("%s: %w", s.name, e))
		}
	}
	return errors.Join(errs...)
}

// hostPort checks a HOST:PORT; empty is allowed unless required.
func hostPort(key, v string, required bool) error {
	if v == "" && !required {
		return nil
	}
	if _, _, err := net.SplitHostPort(v); err != nil {
		return fmt.Errorf("%s %q: want HOST:PORT", key, v)
	}
	return nil
}

func nonNegative(key string, v float64) error {
	if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
		return fmt.Errorf("%s %v: want a finite number >= 0", key, v)
	}
	return nil
}

// Validate checks the section.
func (s Server) Validate() error {
	errs := []error{hostPort("listen", s.Listen, true), hostPort("status_listen", s.StatusListen, false)}
	switch s.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		errs = append(errs, fmt.Errorf("log level %q: want debug, info, warn or error", s.LogLevel))
	}
	if s.ShutdownTimeout <= 0 {
		errs = append(errs, fmt.Errorf("shutdown_timeout %v: must be positive", s.ShutdownTimeout))
	}
	if s.MemoryLimitMiB < 0 {
		errs = append(errs, fmt.Errorf("memory_limit_mib must be >= 0 (0: no limit), got %d", s.MemoryLimitMiB))
	}
	return errors.Join(errs...)
}

// Validate checks that the files go together and exist.
func (s TLS) Validate() error {
	return errors.Join(tlsfiles.ServerOptions{CertFile: s.Cert, KeyFile: s.Key, ClientCAFile: s.ClientCA}.Validate(),
		exists("cert", s.Cert), exists("key", s.Key), exists("client_ca", s.ClientCA))
}

// Validate checks that the token files exist (the collector reads them at
// start and when they change).
func (s Auth) Validate() error {
	return errors.Join(exists("ingest_tokens", s.IngestTokens), exists("read_token_file", s.ReadTokenFile),
		exists("admin_token_file", s.AdminTokenFile))
}

func exists(key, path string) error {
	if path == "" {
		return nil
	}
	if _, err := os.Stat(path); err != nil {
		return fmt.Errorf("%s: %w", key, err)
	}
	return nil
}

// Validate checks the section.
func (s Store) Validate() error {
	var errs []error
	if s.URL != "" {
		u, err := url.Parse(s.URL)
		if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
			errs = append(errs, errors.New("url (--store): want a postgres:// URL"))
		}
		if s.PasswordFile != "" {
			if _, err := os.Stat(s.PasswordFile); err != nil {
				errs = append(errs, fmt.Errorf("password_file (--store-password-file): %w", err))
			}
		}
	} else if s.Data == "" {
		errs = append(errs, errors.New("data: the data directory is empty"))
	}
	if s.GCInterval < 0 || s.RawRetention < 0 {
		errs = append(errs, fmt.Errorf("gc_interval %v and raw_retention %v must be >= 0", s.GCInterval, s.RawRetention))
	}
	if w := s.CommitWindow; w != nil && (*w < 0 || *w > time.Second) {
		errs = append(errs, fmt.Errorf("commit_window %v: want between 0 and 1s", *w))
	}
	return errors.Join(errs...)
}

// Validate checks the section.
func (s Limits) Validate() error {
	if s.MaxLiveRunsPerNode < 0 || s.MaxNewRunsPerMinute < 0 || s.MaxBatchRunRecords < 0 {
		return errors.New("every limit must be >= 0")
	}
	return nil
}

// Validate checks the numbers; the files are read by ServerConfig, and the
// model as a whole by the server (a tariff beside a flat price, the PUE).
func (s Pricing) Validate() error {
	errs := []error{nonNegative("gpu_price_per_hour", s.GPUPricePerHour), nonNegative("energy_price_kwh", s.EnergyPriceKWh)}
	for key, m := range map[string]map[string]float64{"node_gpu_price": s.NodeGPUPrice, "priority_multiplier": s.PriorityMultiplier} {
		for k, v := range m {
			if k == "" {
				errs = append(errs, fmt.Errorf("%s: an empty name", key))
			}
			errs = append(errs, nonNegative(key+" "+k, v))
		}
	}
	return errors.Join(errs...)
}

// Validate checks the section; the zones against the file and the API are
// the server's check.
func (s Carbon) Validate() error {
	errs := []error{nonNegative("grid_gco2_kwh", s.GridGCO2KWh)}
	if s.FetchInterval <= 0 {
		errs = append(errs, fmt.Errorf("fetch_interval must be > 0, got %v", s.FetchInterval))
	} else if s.API != "" && s.FetchInterval < time.Minute {
		errs = append(errs, fmt.Errorf("fetch_interval (--carbon-fetch-interval) %v: at least 1m (the API publishes hourly)", s.FetchInterval))
	}
	if s.APITokenFile != "" && s.API == "" {
		errs = append(errs, errors.New("api_token_file (--carbon-api-token-file) without api (--carbon-api)"))
	}
	for node, zone := range s.NodeZones {
		if node == "" || zone == "" {
			errs = append(errs, fmt.Errorf("node_zones %q: %q: want NODE: ZONE", node, zone))
		}
	}
	return errors.Join(errs...)
}

// Validate checks the schedule and the names; whether a provider has its
// key is the server's check, once the keys are read.
func (s Prices) Validate() error {
	errs := []error{pricewatch.ValidateSchedule(s.FetchInterval, s.MaxAge)}
	for _, p := range s.Providers {
		if !slices.Contains(server.PriceProviders, p) {
			errs = append(errs, fmt.Errorf("provider %q: want any of %v", p, server.PriceProviders))
		}
	}
	return errors.Join(errs...)
}

// Validate checks the section.
func (s Budgets) Validate() error {
	return server.BudgetConfig{EvalInterval: s.EvalInterval, Timezone: s.Timezone}.Validate()
}

// Validate checks the URLs given here; those of the files are checked when
// ServerConfig reads them.
func (s Alerts) Validate() error {
	var errs []error
	if s.WebhookRetries < 0 {
		errs = append(errs, fmt.Errorf("webhook_retries (--webhook-retries) must be >= 0, got %d", s.WebhookRetries))
	}
	return errors.Join(append(errs, alert.WebhookConfig{URLs: s.Webhooks}.Validate())...)
}

// Validate checks the section.
func (s OTel) Validate() error { return s.Config.Validate() }

// Validate checks the section.
func (s Console) Validate() error { return hostPort("listen", s.Listen, false) }
