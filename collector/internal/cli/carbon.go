package cli

import (
	"fmt"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/trainmeter/trainmeter/collector/internal/carbonwatch"
	"github.com/trainmeter/trainmeter/collector/internal/server"
	"github.com/trainmeter/trainmeter/pkg/cost"
	"github.com/trainmeter/trainmeter/pkg/tlsfiles"
)

// EnvCarbonToken names the environment variable with the carbon API's
// token, used when --carbon-api-token-file is not given.
const EnvCarbonToken = "TRAINMETER_CARBON_TOKEN"

// carbonServeFlags are `serve`'s carbon-by-the-hour flags (docs/costs.md, "CO2").
type carbonServeFlags struct {
	file      string
	tokenFile string
	nodeZones []string
}

func (f *carbonServeFlags) add(fs *pflag.FlagSet, cfg *server.Config) {
	fs.StringVar(&f.file, "carbon-file", "", "grid carbon intensity by weekday and time of day per zone (YAML, docs/costs.md); --grid-gco2-kwh covers the rest")
	fs.StringVar(&cfg.Carbon.API.BaseURL, "carbon-api", "", "live carbon intensity from an ElectricityMaps-shaped API at this base URL (e.g. "+carbonwatch.DefaultBaseURL+"); asked before --carbon-file")
	fs.StringVar(&f.tokenFile, "carbon-api-token-file", "", "file with the carbon API's token, sent as auth-token (default $"+EnvCarbonToken+"; optional)")
	fs.DurationVar(&cfg.Carbon.API.Interval, "carbon-fetch-interval", carbonwatch.DefaultInterval, "how often the carbon API is asked, the first time at start")
	fs.StringVar(&cfg.Carbon.Zone, "carbon-zone", "", "carbon zone of every node not given by --carbon-node-zone (default: the carbon file's zone if it has only one)")
	fs.StringArrayVar(&f.nodeZones, "carbon-node-zone", nil, "NODE=ZONE: the carbon zone of NODE's grid (repeatable)")
}

func (f *carbonServeFlags) apply(cfg *server.Config, getenv func(string) string) error {
	if f.file != "" {
		cf, err := cost.LoadCarbonFile(f.file)
		if err != nil {
			return fmt.Errorf("--carbon-file: %w", err)
		}
		cfg.Carbon.File = cf
	}
	for _, v := range f.nodeZones {
		node, zone, ok := strings.Cut(v, "=")
		if !ok || node == "" || zone == "" {
			return fmt.Errorf("--carbon-node-zone %q: want NODE=ZONE", v)
		}
		if cfg.Carbon.NodeZones == nil {
			cfg.Carbon.NodeZones = map[string]string{}
		}
		cfg.Carbon.NodeZones[node] = zone
	}
	if cfg.Carbon.API.Interval <= 0 {
		return fmt.Errorf("--carbon-fetch-interval must be > 0, got %v", cfg.Carbon.API.Interval)
	}
	if cfg.Carbon.API.Interval < time.Minute && cfg.Carbon.API.Enabled() {
		return fmt.Errorf("--carbon-fetch-interval %v: at least 1m (the API publishes hourly)", cfg.Carbon.API.Interval)
	}
	switch {
	case f.tokenFile != "":
		k, err := tlsfiles.ReadSecretFile(f.tokenFile)
		if err != nil {
			return fmt.Errorf("--carbon-api-token-file: %w", err)
		}
		cfg.Carbon.API.Token = k
	case getenv != nil:
		cfg.Carbon.API.Token = strings.TrimSpace(getenv(EnvCarbonToken))
	}
	if !cfg.Carbon.API.Enabled() && (f.tokenFile != "") {
		return fmt.Errorf("--carbon-api-token-file without --carbon-api")
	}
	return nil
}
