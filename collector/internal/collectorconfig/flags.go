package collectorconfig

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/trainmeter/trainmeter/collector/internal/pricing/carbonwatch"
	"github.com/trainmeter/trainmeter/collector/internal/pricing/cost"
	"github.com/trainmeter/trainmeter/collector/internal/pricing/prices"
	"github.com/trainmeter/trainmeter/collector/internal/server"
	"github.com/trainmeter/trainmeter/pkg/otelexport"
)

// BindFlags defines serve's flags on fs, each filling one key of c, with
// c's values as their defaults. docs/config.md pairs each key with its flag.
// Apply the returned otelexport.Flags after parsing (the --otlp-header
// values join otel.headers).
func BindFlags(fs *pflag.FlagSet, c *Config) *otelexport.Flags {
	s, st, l, p, cb, pr, a := &c.Server, &c.Store, &c.Limits, &c.Pricing, &c.Carbon, &c.Prices, &c.Alerts
	fs.StringVar(&s.Listen, "listen", s.Listen, "address to listen on HOST:PORT")
	fs.StringVar(&s.StatusListen, "status-listen", s.StatusListen, "serve GET /healthz and GET /status on HOST:PORT (empty: off)")
	fs.StringVar(&s.LogLevel, "log-level", s.LogLevel, "log level: debug, info, warn, error")
	fs.DurationVar(&s.ShutdownTimeout, "shutdown-timeout", s.ShutdownTimeout, "how long a graceful shutdown may take")
	fs.Int64Var(&s.MemoryLimitMiB, "memory-limit-mib", s.MemoryLimitMiB, "soft memory limit of the Go heap in MiB: garbage is collected more often near it, and it is exceeded when live data needs more (0: none; GOMEMLIMIT wins)")

	fs.StringVar(&c.TLS.Cert, "tls-cert", c.TLS.Cert, "serve TLS with this PEM certificate (chain); re-read when it changes")
	fs.StringVar(&c.TLS.Key, "tls-key", c.TLS.Key, "PEM private key of --tls-cert")
	fs.StringVar(&c.TLS.ClientCA, "tls-client-ca", c.TLS.ClientCA, "require client certificates signed by this PEM CA bundle (mTLS)")
	fs.StringVar(&c.Auth.IngestTokens, "ingest-tokens", c.Auth.IngestTokens, "YAML file of node: token; agents must send their node's token")
	fs.StringVar(&c.Auth.ReadTokenFile, "read-token-file", c.Auth.ReadTokenFile, "file with the token for read-only query RPCs")
	fs.StringVar(&c.Auth.AdminTokenFile, "admin-token-file", c.Auth.AdminTokenFile, "file with the admin token (all query RPCs, DeleteRun)")

	fs.StringVar(&st.Data, "data", st.Data, "data directory (BadgerDB), unless --store")
	fs.StringVar(&st.URL, "store", st.URL, "keep the data in this PostgreSQL database (postgres://USER@HOST/DB?sslmode=verify-full), shared by any number of collectors, instead of --data (docs/deploy.md)")
	fs.StringVar(&st.PasswordFile, "store-password-file", st.PasswordFile, "file holding the --store database's password (or put it in the URL; never logged)")
	fs.DurationVar(&st.GCInterval, "gc-interval", st.GCInterval, "value-log GC interval (0 disables)")
	fs.Func("commit-window", fmt.Sprintf("how long a batch waits for others to share its durable commit (acks up to this much later; fewer commits per batch: docs/benchmarks.md); 0: commit at once (default %v on BadgerDB, %v with --store)",
		server.DefaultCommitWindow, server.DefaultPostgresCommitWindow), func(v string) error {
		d, err := time.ParseDuration(v)
		st.CommitWindow = &d
		return err
	})
	fs.DurationVar(&st.RawRetention, "raw-retention", st.RawRetention, "drop raw records (GPU/host windows, raw samples, run windows/events) older than this, e.g. 720h; run aggregates are kept (0: keep all)")
	fs.IntVar(&l.MaxLiveRunsPerNode, "max-live-runs-per-node", l.MaxLiveRunsPerNode, "refuse a run_start that would make more runs live on one node at once (docs/security.md)")
	fs.IntVar(&l.MaxNewRunsPerMinute, "max-new-runs-per-minute", l.MaxNewRunsPerMinute, "refuse a node's run_start of a new run id beyond this many a minute (docs/security.md)")
	fs.IntVar(&l.MaxBatchRunRecords, "max-batch-run-records", l.MaxBatchRunRecords, "reject a batch with more records naming a run (windows, events, loss records, host energy shares) than this (docs/security.md)")

	fs.Float64Var(&p.GPUPricePerHour, "gpu-price-per-hour", p.GPUPricePerHour, "default $ per GPU-hour for runs that send none (0 = unknown)")
	fs.Float64Var(&p.EnergyPriceKWh, "energy-price-kwh", p.EnergyPriceKWh, "energy price in $ per kWh (0 = unknown)")
	fs.BoolVar(&p.EnergyIncluded, "energy-included", p.EnergyIncluded, "the GPU price includes power (cloud rentals): energy cost is 0")
	fs.StringVar(&p.Tariff, "tariff", p.Tariff, "time-of-use energy tariff (YAML, docs/costs.md); instead of --energy-price-kwh")
	fs.StringVar(&p.OwnedHardware, "owned-hardware", p.OwnedHardware, "owned GPUs priced from their purchase, and the PUE (YAML, docs/costs.md)")
	fs.Float64Var(&p.PUE, "pue", p.PUE, "power usage effectiveness (>= 1): energy cost and CO2 are of GPU energy × PUE (default: the --owned-hardware file's, else 1)")
	fs.Var(&kvFlag[float64]{"node-gpu-price", &p.NodeGPUPrice, cost.ParseKeyFloat}, "node-gpu-price", "NODE=USD: $ per GPU-hour of NODE's GPUs when run_start gives none (repeatable)")
	fs.Var(&kvFlag[float64]{"priority-multiplier", &p.PriorityMultiplier, cost.ParseKeyFloat}, "priority-multiplier", "PRIORITY=X: compute cost multiplier for runs whose priority label is PRIORITY (repeatable)")

	fs.Float64Var(&cb.GridGCO2KWh, "grid-gco2-kwh", cb.GridGCO2KWh, "grid carbon intensity in gCO2 per kWh (0 = unknown); with --carbon-file or --carbon-api, for the energy they do not cover")
	fs.StringVar(&cb.File, "carbon-file", cb.File, "grid carbon intensity by weekday and time of day per zone (YAML, docs/costs.md); --grid-gco2-kwh covers the rest")
	fs.StringVar(&cb.API, "carbon-api", cb.API, "live carbon intensity from an ElectricityMaps-shaped API at this base URL (e.g. "+carbonwatch.DefaultBaseURL+"); asked before --carbon-file")
	fs.StringVar(&cb.APITokenFile, "carbon-api-token-file", cb.APITokenFile, "file with the carbon API's token, sent as auth-token (default $"+EnvCarbonToken+"; optional)")
	fs.DurationVar(&cb.FetchInterval, "carbon-fetch-interval", cb.FetchInterval, "how often the carbon API is asked, the first time at start")
	fs.StringVar(&cb.Zone, "carbon-zone", cb.Zone, "carbon zone of every node not given by --carbon-node-zone (default: the carbon file's zone if it has only one)")
	fs.Var(&kvFlag[string]{"carbon-node-zone", &cb.NodeZones, parseZone}, "carbon-node-zone", "NODE=ZONE: the carbon zone of NODE's grid (repeatable)")

	fs.StringSliceVar(&pr.Providers, "price-provider", pr.Providers, "GPU price sources, comma-separated: vastai, lambda, runpod, azure, file (empty: none)")
	fs.StringVar(&pr.VastAIURL, "vastai-url", pr.VastAIURL, "vast.ai API base URL (default https://console.vast.ai)")
	fs.StringVar(&pr.VastAIKeyFile, "vastai-key-file", pr.VastAIKeyFile, "file with the vast.ai API key (default $"+EnvVastAIKey+"; optional)")
	fs.StringVar(&pr.LambdaURL, "lambda-url", pr.LambdaURL, "Lambda cloud API base URL (default "+prices.DefaultLambdaURL+")")
	fs.StringVar(&pr.LambdaKeyFile, "lambda-key-file", pr.LambdaKeyFile, "file with the Lambda API key (default $"+EnvLambdaKey+"; needed by --price-provider lambda)")
	fs.StringVar(&pr.RunPodURL, "runpod-url", pr.RunPodURL, "RunPod GraphQL endpoint (default "+prices.DefaultRunPodURL+")")
	fs.StringVar(&pr.RunPodKeyFile, "runpod-key-file", pr.RunPodKeyFile, "file with the RunPod API key (default $"+EnvRunPodKey+"; needed by --price-provider runpod)")
	fs.StringVar(&pr.AzureURL, "azure-url", pr.AzureURL, "Azure retail prices API base URL (default "+prices.DefaultAzureURL+"; no key)")
	fs.StringSliceVar(&pr.AzureRegions, "azure-regions", pr.AzureRegions, "Azure regions (armRegionName, comma-separated: eastus,westeurope) to price; default every region")
	fs.StringVar(&pr.File, "price-file", pr.File, "CSV or JSON price list for --price-provider file")
	fs.DurationVar(&pr.FetchInterval, "price-fetch-interval", pr.FetchInterval, "how often prices are fetched, the first time at start (0: only by \"trainmeter prices fetch\")")
	fs.DurationVar(&pr.MaxAge, "price-max-age", pr.MaxAge, "a provider's offers older than this (its fetches failing) are stale: listed, but no current price (0: max(24h, 3 × --price-fetch-interval); imported lists never go stale)")

	fs.DurationVar(&c.Budgets.EvalInterval, "budget-eval-interval", c.Budgets.EvalInterval, "how often budgets are evaluated after runs changed")
	fs.StringVar(&c.Budgets.Timezone, "budget-timezone", c.Budgets.Timezone, "time zone of the calendar months of monthly budgets (IANA name)")
	fs.StringArrayVar(&a.Webhooks, "webhook", a.Webhooks, "POST every alert as JSON to this URL (repeatable; visible in ps: a URL with a secret goes in --webhook-url-file)")
	fs.StringArrayVar(&a.WebhookURLFiles, "webhook-url-file", a.WebhookURLFiles, "file of webhook URLs, one a line (# comments), each as --webhook; keeps secrets in URLs off the command line (repeatable)")
	fs.IntVar(&a.WebhookRetries, "webhook-retries", a.WebhookRetries, "retries of a failed alert delivery per webhook (network errors, 5xx and 429; with backoff)")

	otelFlags := otelexport.BindFlags(fs, &c.OTel.Config)
	fs.BoolVar(&c.OTel.PrometheusRunMetrics, "prometheus-run-metrics", c.OTel.PrometheusRunMetrics, "show the run-level series of /metrics (run ids, models, budget scopes) to every scrape; default: only to scrapes with the read or admin token (docs/otel.md)")
	fs.StringVar(&c.Console.Listen, "ui-listen", c.Console.Listen, "serve the web console on HOST:PORT (empty: off); same TLS and read token as the query API (docs/console.md)")
	return otelFlags
}

// Resolve sets c to the defaults, then the file at path (none when ""),
// then the flags given on fs's command line, which BindFlags bound to c:
// a flag set by the user wins over the file; a flag left alone does not
// put its default back over the file's value. A repeatable flag replaces
// the file's list or map. Resolve reports the file's problems; c holds
// what could be read either way.
func Resolve(fs *pflag.FlagSet, path string, c *Config) error {
	type given struct {
		v    pflag.Value
		s    string
		list []string
	}
	var set []given
	fs.Visit(func(f *pflag.Flag) {
		if l, ok := f.Value.(pflag.SliceValue); ok {
			set = append(set, given{v: f.Value, list: slices.Clone(l.GetSlice())})
		} else {
			set = append(set, given{v: f.Value, s: f.Value.String()})
		}
	})
	*c = Default()
	var err error
	if path != "" {
		err = Load(path, c)
	}
	for _, g := range set { // the values parsed once already: no error
		if l, ok := g.v.(pflag.SliceValue); ok {
			_ = l.Replace(g.list)
		} else {
			_ = g.v.Set(g.s)
		}
	}
	return err
}

// kvFlag is a repeatable NAME=VALUE flag filling a map; given, it replaces
// the map the file set.
type kvFlag[V any] struct {
	name  string
	m     *map[string]V
	parse func(string) (string, V, error)
}

func (f *kvFlag[V]) Set(s string) error {
	k, v, err := f.parse(s)
	if err != nil {
		return fmt.Errorf("--%s %w", f.name, err)
	}
	if *f.m == nil {
		*f.m = map[string]V{}
	}
	(*f.m)[k] = v
	return nil
}

func (f *kvFlag[V]) Type() string   { return "NAME=VALUE" }
func (f *kvFlag[V]) String() string { return strings.Join(f.GetSlice(), ",") }

func (f *kvFlag[V]) GetSlice() []string {
	var out []string
	for k, v := range *f.m {
		out = append(out, fmt.Sprintf("%s=%v", k, v))
	}
	sort.Strings(out)
	return out
}

func (f *kvFlag[V]) Replace(vals []string) error {
	*f.m = nil
	for _, v := range vals {
		if err := f.Set(v); err != nil {
			return err
		}
	}
	return nil
}

func (f *kvFlag[V]) Append(s string) error { return f.Set(s) }

func parseZone(s string) (string, string, error) {
	node, zone, ok := strings.Cut(s, "=")
	if !ok || node == "" || zone == "" {
		return "", "", fmt.Errorf("%q: want NODE=ZONE", s)
	}
	return node, zone, nil
}
