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

// Config is the agent's configuration; the YAML file and the flags fill it.
type Config struct {
	// Collector is the collector's HOST:PORT, or a collector pair's
	// "A,B" (comma-separated; in YAML also a list): every batch goes to
	// each (Collectors, docs/deploy.md).
	Collector string `yaml:"collector"`
	// Socket is the trainer socket path.
	Socket string `yaml:"socket"`
	// SocketGroup, when set, owns the socket (mode 0660), so trainers of that
	// group can connect.
	SocketGroup string `yaml:"socket_group"`
	// Node names this box; default: the hostname.
	Node string `yaml:"node"`
	// GPU is the backend: nvml, amd, sim:N, replay:FILE, or auto (nvml if
	// found, else amd if AMD GPUs and no NVIDIA GPU are found).
	GPU string `yaml:"gpu"`
	// SysfsRoot is the root of the sysfs tree (default /sys): the amd
	// backend's and auto's cards, and RAPL under class/powercap (empty in a
	// programmatic config: host energy off); tests point it at a fixture.
	SysfsRoot string `yaml:"sysfs_root"`
	// ProcfsRoot is the root of the procfs tree (default /proc): process
	// trees, their CPU time, and AMD per-process usage (fdinfo); tests point
	// it at a fixture.
	ProcfsRoot string `yaml:"procfs_root"`
	// Interval is the GPU sampling period.
	Interval time.Duration `yaml:"interval"`
	// Warmup is excluded from efficiency figures unless run_start says
	// otherwise; with WarmupSteps, the default warmup ends at whichever comes
	// first (docs/measurement.md, "Warmup").
	Warmup time.Duration `yaml:"warmup"`
	// WarmupSteps ends the default warmup at the run's N-th step when that
	// comes before Warmup (0: Warmup alone).
	WarmupSteps uint64 `yaml:"warmup_steps"`
	// HostInterval is the host (RAM, CPU, RAPL energy) sampling period.
	HostInterval time.Duration `yaml:"host_interval"`
	// HostReplay, when set, plays a host trace (RAM, CPUs; pkg/host Replay,
	// docs/replay-format.md) instead of reading the real host: for tests and
	// demos of the dataloader advice.
	HostReplay string `yaml:"host_replay"`
	// RawSamples sends every GPU sample to the collector too (RawSamples in
	// the batches), besides the 1 s summaries. Off by default.
	RawSamples bool `yaml:"raw_samples"`
	// Spool is the directory that keeps batches until the collector acks
	// them, across collector outages and agent restarts.
	Spool string `yaml:"spool"`
	// SpoolMaxBytes bounds the spool; when full, the oldest batches are
	// dropped and reported (the runs are marked incomplete).
	SpoolMaxBytes int64 `yaml:"spool_max_bytes"`
	// RejoinGrace is how long, after an agent restart, a resumed run waits
	// for one of its ranks to reconnect before it is ended at the restart.
	RejoinGrace time.Duration `yaml:"rejoin_grace"`
	// LogLevel is debug, info, warn or error.
	LogLevel string `yaml:"log_level"`
	// StatusListen, when set (HOST:PORT), serves GET /healthz and GET /status
	// (the agent's own health, docs/observability.md) over plain HTTP.
	StatusListen string `yaml:"status_listen"`

	// TLSCA is the PEM CA bundle that signs the collector's certificate;
	// setting it (or any TLS key) turns TLS on.
	TLSCA string `yaml:"tls_ca"`
	// TLSCert and TLSKey are the agent's client certificate for mTLS.
	TLSCert string `yaml:"tls_cert"`
	TLSKey  string `yaml:"tls_key"`
	// TLSServerName overrides the name checked in the collector's certificate.
	TLSServerName string `yaml:"tls_server_name"`
	// TokenFile holds this node's ingest token (sent as a bearer token). It
	// needs TLS unless the collector is on a loopback address.
	TokenFile string `yaml:"token_file"`
	// AllowedUIDs, when not empty, are the uids allowed to report on the
	// trainer socket (root always is); empty: whoever can open the socket.
	AllowedUIDs []uint32 `yaml:"allowed_uids"`
	// SocketMaxConnsPerUID caps the trainer-socket connections one uid may
	// hold open; more from that uid are refused, so one user's connections
	// cannot lock the others out. Default 64.
	SocketMaxConnsPerUID int `yaml:"socket_max_conns_per_uid"`
	// SocketIdleTimeout closes a trainer-socket connection that has sent
	// no accepted run_start this long after connecting. Default 30 s; 0:
	// never.
	SocketIdleTimeout time.Duration `yaml:"socket_idle_timeout"`
	// OTel, when set, exports this node's GPUs (hw.* metrics) directly over
	// OTLP and/or Prometheus, without the collector (docs/otel.md).
	OTel otelexport.Config `yaml:"otel"`
}

// TLSOptions returns the uplink's TLS file settings.
func (c *Config) TLSOptions() tlsfiles.ClientOptions {
	return tlsfiles.ClientOptions{CAFile: c.TLSCA, CertFile: c.TLSCert, KeyFile: c.TLSKey, ServerName: c.TLSServerName}
}

// DefaultConfig is what the agent runs with when nothing is set.
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

func DefaultConfig() Config {
	return Config{
		Collector:     "127.0.0.1:7433",
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
	if c.Spool == "" {
		errs = append(errs, errors.New("spool directory is empty"))
	}
	if c.SpoolMaxBytes < spool.MinMaxBytes {
		errs = append(errs, fmt.Errorf("spool_max_bytes %d: want at least %d", c.SpoolMaxBytes, spool.MinMaxBytes))
	}
	if c.SocketMaxConnsPerUID < 1 {
		errs = append(errs, fmt.Errorf("socket_max_conns_per_uid %d: want at least 1", c.SocketMaxConnsPerUID))
	}
	if c.SocketIdleTimeout < 0 {
		errs = append(errs, fmt.Errorf("socket_idle_timeout %v: must not be negative (0: never)", c.SocketIdleTimeout))
	}
	if c.RejoinGrace < 0 {
		errs = append(errs, fmt.Errorf("rejoin_grace %v: must not be negative", c.RejoinGrace))
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
	switch c.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		errs = append(errs, fmt.Errorf("log_level %q: want debug, info, warn or error", c.LogLevel))
	}
	return errors.Join(errs...)
}
