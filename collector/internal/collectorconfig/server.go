package collectorconfig

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/trainmeter/trainmeter/collector/internal/alert"
	"github.com/trainmeter/trainmeter/collector/internal/pricing/carbonwatch"
	"github.com/trainmeter/trainmeter/collector/internal/pricing/cost"
	"github.com/trainmeter/trainmeter/collector/internal/server"
	"github.com/trainmeter/trainmeter/pkg/tlsfiles"
)

// The environment variables with the API keys and the carbon token, each
// used when its key file is not given.
const (
	EnvVastAIKey   = "TRAINMETER_VASTAI_KEY"
	EnvLambdaKey   = "TRAINMETER_LAMBDA_KEY"
	EnvRunPodKey   = "TRAINMETER_RUNPOD_KEY"
	EnvCarbonToken = "TRAINMETER_CARBON_TOKEN"
)

// Check is what serve runs before it starts and what `serve --check`
// reports: every section's problems and every file that cannot be read,
// then, when those are sound, the server's own check of what spans
// sections. Each problem is reported once.
func (c Config) Check(getenv func(string) string) (server.Config, error) {
	verr := c.Validate()
	sc, lerr := c.ServerConfig(getenv)
	if verr != nil || lerr != nil {
		return sc, errors.Join(verr, lerr)
	}
	return sc, sc.Validate()
}

// ServerConfig maps c onto the server's configuration and reads the files
// it names: tariff, owned hardware, carbon by the hour, API keys (a key file
// not given: its environment variable, read through getenv), webhook URLs.
// Errors name the key and its flag.
func (c Config) ServerConfig(getenv func(string) string) (server.Config, error) {
	p, cb, pr := c.Pricing, c.Carbon, c.Prices
	sc := server.Config{
		Listen: c.Server.Listen, StatusListen: c.Server.StatusListen,
		DataDir: c.Store.Data, StoreURL: c.Store.URL, StorePasswordFile: c.Store.PasswordFile, GCInterval: c.Store.GCInterval, CommitWindow: c.Store.commitWindow(), RawRetention: c.Store.RawRetention,
		MaxLiveRunsPerNode: c.Limits.MaxLiveRunsPerNode, MaxNewRunsPerMinute: c.Limits.MaxNewRunsPerMinute, MaxBatchRunRecords: c.Limits.MaxBatchRunRecords,
		TLSCertFile: c.TLS.Cert, TLSKeyFile: c.TLS.Key, TLSClientCAFile: c.TLS.ClientCA,
		IngestTokensFile: c.Auth.IngestTokens, ReadTokenFile: c.Auth.ReadTokenFile, AdminTokenFile: c.Auth.AdminTokenFile,

		GPUPricePerHour: p.GPUPricePerHour, EnergyPricePerKWh: p.EnergyPriceKWh, EnergyIncluded: p.EnergyIncluded,
		NodeGPUPricePerHour: p.NodeGPUPrice, PriorityMultipliers: p.PriorityMultiplier, PUE: p.PUE,
		GridGCO2PerKWh: cb.GridGCO2KWh,
		Carbon:         server.CarbonConfig{API: carbonwatch.Config{BaseURL: cb.API, Interval: cb.FetchInterval}, Zone: cb.Zone, NodeZones: cb.NodeZones},

		Budget: server.BudgetConfig{EvalInterval: c.Budgets.EvalInterval, Timezone: c.Budgets.Timezone},
		Alerts: server.AlertConfig{Webhook: alert.WebhookConfig{URLs: slices.Clone(c.Alerts.Webhooks), MaxAttempts: c.Alerts.WebhookRetries + 1}},
		Prices: server.PriceConfig{Provider: strings.Join(pr.Providers, ","), VastAIURL: pr.VastAIURL, LambdaURL: pr.LambdaURL,
			RunPodURL: pr.RunPodURL, AzureURL: pr.AzureURL, AzureRegions: pr.AzureRegions, File: pr.File,
			FetchInterval: pr.FetchInterval, MaxOfferAge: pr.MaxAge},

		OTel: c.OTel.Config, PrometheusRunMetrics: c.OTel.PrometheusRunMetrics,
		// The default console address taken (a second collector on the
		// machine) leaves the collector without a console, not failing.
		UIListen: c.Console.Listen, UIListenDefault: c.Console.Listen == server.DefaultUIListen,
	}
	var errs []error
	load := func(key, flag, path string, read func(string) error) {
		if path == "" {
			return
		}
		if err := read(path); err != nil {
			errs = append(errs, fmt.Errorf("%s (--%s): %w", key, flag, err))
		}
	}
	load("pricing.tariff", "tariff", p.Tariff, func(f string) (err error) { sc.Tariff, err = cost.LoadTariff(f); return err })
	load("pricing.owned_hardware", "owned-hardware", p.OwnedHardware, func(f string) (err error) {
		if sc.OwnedHardware, err = cost.LoadOwnedHardware(f); err == nil && sc.PUE == 0 {
			sc.PUE = sc.OwnedHardware.PUE // pricing.pue, when set, wins over the file's
		}
		return err
	})
	load("carbon.file", "carbon-file", cb.File, func(f string) (err error) { sc.Carbon.File, err = cost.LoadCarbonFile(f); return err })
	for _, k := range []struct {
		key, flag, path, env string
		dst                  *string
	}{
		{"carbon.api_token_file", "carbon-api-token-file", cb.APITokenFile, EnvCarbonToken, &sc.Carbon.API.Token},
		{"prices.vastai_key_file", "vastai-key-file", pr.VastAIKeyFile, EnvVastAIKey, &sc.Prices.VastAIKey},
		{"prices.lambda_key_file", "lambda-key-file", pr.LambdaKeyFile, EnvLambdaKey, &sc.Prices.LambdaKey},
		{"prices.runpod_key_file", "runpod-key-file", pr.RunPodKeyFile, EnvRunPodKey, &sc.Prices.RunPodKey},
	} {
		if k.path == "" && getenv != nil {
			*k.dst = strings.TrimSpace(getenv(k.env))
		}
		load(k.key, k.flag, k.path, func(f string) (err error) { *k.dst, err = tlsfiles.ReadSecretFile(f); return err })
	}
	for _, f := range c.Alerts.WebhookURLFiles {
		load("alerts.webhook_url_files", "webhook-url-file", f, func(f string) error {
			urls, err := readWebhookFile(f)
			sc.Alerts.Webhook.URLs = append(sc.Alerts.Webhook.URLs, urls...)
			return err
		})
	}
	return sc, errors.Join(errs...)
}

// readWebhookFile reads webhook URLs, one a line; blank lines and lines
// starting with # are skipped. Errors name the file, never a URL (it may
// hold a secret).
func readWebhookFile(path string) ([]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var urls []string
	for _, line := range strings.Split(string(b), "\n") {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
			urls = append(urls, line)
		}
	}
	if len(urls) == 0 {
		return nil, fmt.Errorf("%s: no URL in it", path)
	}
	return urls, nil
}

// commitWindow is the window set, or the store's default.
func (s Store) commitWindow() time.Duration {
	switch {
	case s.CommitWindow != nil:
		return *s.CommitWindow
	case s.URL != "":
		return server.DefaultPostgresCommitWindow
	}
	return server.DefaultCommitWindow
}
