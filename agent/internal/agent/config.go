package agent

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// Config is the agent's configuration; the YAML file and the flags fill it.
type Config struct {
	// Collector is the collector's HOST:PORT.
	Collector string `yaml:"collector"`
	// Socket is the trainer socket path.
	Socket string `yaml:"socket"`
	// SocketGroup, when set, owns the socket (mode 0660), so trainers of that
	// group can connect.
	SocketGroup string `yaml:"socket_group"`
	// Node names this box; default: the hostname.
	Node string `yaml:"node"`
	// GPU is the backend: nvml, sim:N, replay:FILE, or auto (nvml if found).
	GPU string `yaml:"gpu"`
	// Interval is the GPU sampling period.
	Interval time.Duration `yaml:"interval"`
	// Warmup is excluded from efficiency figures unless run_start says otherwise.
	Warmup time.Duration `yaml:"warmup"`
	// HostInterval is the host (RAM, CPU) sampling period.
	HostInterval time.Duration `yaml:"host_interval"`
	// LogLevel is debug, info, warn or error.
	LogLevel string `yaml:"log_level"`
}

// DefaultConfig is what the agent runs with when nothing is set.
func DefaultConfig() Config {
	return Config{
		Collector:    "127.0.0.1:7433",
		Socket:       "/run/trainmeter/agent.sock",
		GPU:          "auto",
		Interval:     50 * time.Millisecond,
		Warmup:       60 * time.Second,
		HostInterval: time.Second,
		LogLevel:     "info",
	}
}

// LoadConfigFile reads a YAML config over cfg. Unknown keys are an error, so a
// typo does not silently leave a default in place.
func LoadConfigFile(path string, cfg *Config) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	defer f.Close()
	dec := yaml.NewDecoder(f)
	dec.KnownFields(true)
	if err := dec.Decode(cfg); err != nil {
		return fmt.Errorf("config %s: %w", path, err)
	}
	return nil
}

// Validate reports every problem with the configuration at once.
func (c *Config) Validate() error {
	var errs []error
	if c.Collector == "" {
		errs = append(errs, errors.New("collector address is empty"))
	} else if !strings.Contains(c.Collector, ":") {
		errs = append(errs, fmt.Errorf("collector %q: want HOST:PORT", c.Collector))
	}
	if c.Socket == "" {
		errs = append(errs, errors.New("socket path is empty"))
	}
	if c.Interval < time.Millisecond || c.Interval > 10*time.Second {
		errs = append(errs, fmt.Errorf("interval %v: want between 1ms and 10s", c.Interval))
	}
	if c.Warmup < 0 {
		errs = append(errs, fmt.Errorf("warmup %v: must not be negative", c.Warmup))
	}
	if c.HostInterval <= 0 {
		errs = append(errs, fmt.Errorf("host_interval %v: must be positive", c.HostInterval))
	}
	switch c.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		errs = append(errs, fmt.Errorf("log_level %q: want debug, info, warn or error", c.LogLevel))
	}
	return errors.Join(errs...)
}
