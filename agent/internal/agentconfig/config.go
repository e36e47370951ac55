// Package agentconfig is the agent's configuration: the YAML file's and
// the flags' fields, their defaults and their validation (README.md lists
// them). It is apart from package agent so that what only reads the
// configuration (doctor) does not import the agent's wiring.
package agentconfig

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/trainmeter/trainmeter/agent/internal/ledger"
	"github.com/trainmeter/trainmeter/agent/internal/spool"
	"github.com/trainmeter/trainmeter/agent/internal/trainersock"
	"github.com/trainmeter/trainmeter/pkg/otelexport"
	"github.com/trainmeter/trainmeter/pkg/tlsfiles"
	"github.com/trainmeter/trainmeter/pkg/trainerwire"
)

// Config is the agent's configuration; the YAML file and the flags fill it
// (main.go's flag help says what each field does).
type Config struct {
	// Collector is the collector's HOST:PORT, or several: "A,B" (in YAML
	// also a list). CollectorMode says where each batch goes: "all" (the
	// default: to each, a pair) or "any" (to one of them, the next when one
	// fails: replicas on one database). docs/deploy.md.
	Collector     string `yaml:"collector"`
	CollectorMode string `yaml:"collector_mode"`
	Socket        string `yaml:"socket"`       // the trainer socket path
	SocketGroup   string `yaml:"socket_group"` // owns the socket (mode 0660)
	Node          string `yaml:"node"`         // default: the hostname
	GPU           string `yaml:"gpu"`          // nvml, amd, sim:N, replay:FILE or auto
	// SysfsRoot is the root of the sysfs tree (default /sys): AMD cards and
	// RAPL (empty in a programmatic config: host energy off).
	SysfsRoot string `yaml:"sysfs_root"`
	// ProcfsRoot is the root of the procfs tree (default /proc): process
	// trees, their CPU time, and AMD per-process usage (fdinfo).
	ProcfsRoot string        `yaml:"procfs_root"`
	Interval   time.Duration `yaml:"interval"` // GPU sampling period
	// Warmup is excluded from efficiency figures unless run_start says
	// otherwise; it ends at Warmup or the WarmupSteps-th step (0: Warmup
	// alone), whichever comes first (docs/measurement.md, "Warmup").
	Warmup       time.Duration `yaml:"warmup"`
	WarmupSteps  uint64        `yaml:"warmup_steps"`
	HostInterval time.Duration `yaml:"host_interval"` // host RAM, CPU and RAPL sampling period
	// HostReplay plays a host trace (agent/internal/host Replay, docs/replay-format.md)
	// instead of reading the real host.
	HostReplay string `yaml:"host_replay"`
	RawSamples bool   `yaml:"raw_samples"` // send every GPU sample too, not only 1 s summaries
	// Spool keeps batches until the collector acks them, across outages
	// and restarts; beyond SpoolMaxBytes the oldest are dropped and reported.
	Spool         string `yaml:"spool"`
	SpoolMaxBytes int64  `yaml:"spool_max_bytes"`
	// RejoinGrace is how long, after an agent restart, a resumed run waits
	// for one of its ranks to reconnect before it is ended at the restart.
	RejoinGrace time.Duration `yaml:"rejoin_grace"`
	LogLevel    string        `yaml:"log_level"` // debug, info, warn or error
	// StatusListen (HOST:PORT) serves GET /healthz and GET /status over
	// plain HTTP (docs/observability.md).
	StatusListen string `yaml:"status_listen"`

	// Setting any of the TLS files or TLSServerName turns TLS on; TLSCert
	// and TLSKey are the client certificate for mTLS.
	TLSCA         string `yaml:"tls_ca"`
	TLSCert       string `yaml:"tls_cert"`
	TLSKey        string `yaml:"tls_key"`
	TLSServerName string `yaml:"tls_server_name"`
	// TokenFile holds this node's ingest token (a bearer token); it needs
	// TLS unless the collector is on a loopback address.
	TokenFile string `yaml:"token_file"`
	// AllowedUIDs may report on the trainer socket (root always may);
	// empty: whoever can open the socket.
	AllowedUIDs []uint32 `yaml:"allowed_uids"`
	// SocketMaxConnsPerUID and SocketIdleTimeout are trainersock's
	// MaxConnsPerUID and IdleTimeout (here 0: never).
	SocketMaxConnsPerUID int           `yaml:"socket_max_conns_per_uid"`
	SocketIdleTimeout    time.Duration `yaml:"socket_idle_timeout"`
	// OTel exports this node's GPUs (hw.* metrics) directly over OTLP
	// and/or Prometheus, without the collector (docs/otel.md).
	OTel otelexport.Config `yaml:"otel"`
	// Kubernetes: pods as GPU owners, from the kubelet (docs/kubernetes.md).
	Kubernetes KubernetesConfig `yaml:"kubernetes"`
	// Attribution turns each owner source of unowned GPU processes off
	// (docs/attribution.md).
	Attribution AttributionConfig `yaml:"attribution"`
}

// TLSOptions returns the uplink's TLS file settings.
func (c *Config) TLSOptions() tlsfiles.ClientOptions {
	return tlsfiles.ClientOptions{CAFile: c.TLSCA, CertFile: c.TLSCert, KeyFile: c.TLSKey, ServerName: c.TLSServerName}
}

// DefaultWarmupSteps: the default warmup also ends at the 20th step. The
// first steps carry compilation, autotuning and allocator growth, and 20
// steps are past them in the trainers we know, yet a short run (train_sim.py's
// 8 s: 80 steps) still gets efficiency figures; a run with slow steps keeps
// the 60 s bound.
const DefaultWarmupSteps = 20

// DefaultSpoolDir is where the agent keeps unacked batches by default.
const DefaultSpoolDir = "/var/lib/trainmeter/spool"

// DefaultSpoolMaxBytes bounds the spool by default: 1 GiB, about 8 days of
// collector outage for an 8-GPU node (see spool.DefaultMaxBytes).
const DefaultSpoolMaxBytes = spool.DefaultMaxBytes

// DefaultConfig is what the agent runs with when nothing is set.
func DefaultConfig() Config {
	return Config{
		Collector:     "127.0.0.1:7433",
		CollectorMode: ModeAll,
		Socket:        trainerwire.DefaultSocket,
		GPU:           "auto",
		SysfsRoot:     "/sys",
		ProcfsRoot:    "/proc",
		Interval:      50 * time.Millisecond,
		Warmup:        60 * time.Second,
		WarmupSteps:   DefaultWarmupSteps,
		HostInterval:  time.Second,
		Spool:         DefaultSpoolDir,
		SpoolMaxBytes: DefaultSpoolMaxBytes,
		RejoinGrace:   ledger.DefaultRejoinGrace,
		LogLevel:      "info",

		SocketMaxConnsPerUID: trainersock.DefaultMaxConnsPerUID,
		SocketIdleTimeout:    trainersock.DefaultIdleTimeout,
		Kubernetes:           DefaultKubernetes(),
		Attribution:          DefaultAttribution(),
	}
}

// LoadConfigFile reads a YAML config over cfg. Unknown keys are an error, so a
// typo does not silently leave a default in place.
func LoadConfigFile(path string, cfg *Config) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	data, err = collectorListAsString(data)
	if err != nil {
		return fmt.Errorf("config %s: %w", path, err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(cfg); err != nil {
		return fmt.Errorf("config %s: %w", path, err)
	}
	return nil
}

// Validate reports every problem with the configuration at once.
func (c *Config) Validate() error {
	var errs []error
	errs = append(errs, c.validateCollectors()...)
	for _, rule := range []struct {
		bad bool
		err error
	}{
		{c.Socket == "", errors.New("socket path is empty")},
		{c.Interval < time.Millisecond || c.Interval > 10*time.Second, fmt.Errorf("interval %v: want between 1ms and 10s", c.Interval)},
		{c.Warmup < 0, fmt.Errorf("warmup %v: must not be negative", c.Warmup)},
		{c.HostInterval <= 0, fmt.Errorf("host_interval %v: must be positive", c.HostInterval)},
		{c.Spool == "", errors.New("spool directory is empty")},
		{c.SpoolMaxBytes < spool.MinMaxBytes, fmt.Errorf("spool_max_bytes %d: want at least %d", c.SpoolMaxBytes, spool.MinMaxBytes)},
		{c.SocketMaxConnsPerUID < 1, fmt.Errorf("socket_max_conns_per_uid %d: want at least 1", c.SocketMaxConnsPerUID)},
		{c.SocketIdleTimeout < 0, fmt.Errorf("socket_idle_timeout %v: must not be negative (0: never)", c.SocketIdleTimeout)},
		{c.RejoinGrace < 0, fmt.Errorf("rejoin_grace %v: must not be negative", c.RejoinGrace)},
	} {
		if rule.bad {
			errs = append(errs, rule.err)
		}
	}
	if err := c.TLSOptions().Validate(); err != nil {
		errs = append(errs, err)
	}
	if c.TokenFile != "" && !c.TLSOptions().Enabled() {
		for _, addr := range c.Collectors() {
			if addr != "" && !tlsfiles.IsLoopback(addr) {
				errs = append(errs, fmt.Errorf("token_file: a token is only sent over TLS to a collector that is not on this machine (%s): set tls_ca", addr))
			}
		}
	}
	if c.StatusListen != "" {
		if _, _, err := net.SplitHostPort(c.StatusListen); err != nil {
			errs = append(errs, fmt.Errorf("status_listen %q: %v", c.StatusListen, err))
		}
	}
	if err := c.OTel.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := c.Kubernetes.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := c.Attribution.Validate(); err != nil {
		errs = append(errs, err)
	}
	switch c.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		errs = append(errs, fmt.Errorf("log_level %q: want debug, info, warn or error", c.LogLevel))
	}
	return errors.Join(errs...)
}
