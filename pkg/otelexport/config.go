// Package otelexport exports trainmeter's metrics (and alert log records)
// through the OpenTelemetry Go SDK: OTLP push over gRPC or HTTP, and/or a
// Prometheus /metrics endpoint served by the OTel Prometheus exporter. The
// collector and the agent both use it; docs/otel.md lists what goes out.
package otelexport

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"strings"
	"time"

	"github.com/spf13/pflag"
)

// Protocols of the OTLP push.
const (
	ProtocolGRPC = "grpc"
	ProtocolHTTP = "http"
)

// DefaultInterval is how often metrics are pushed over OTLP.
const DefaultInterval = 15 * time.Second

// Config says where metrics go. The zero value exports nothing.
type Config struct {
	Endpoint string `yaml:"endpoint"` // the OTLP receiver's HOST:PORT; empty: no push
	// Protocol is grpc (default, port 4317 by convention) or http
	// (OTLP/HTTP protobuf, port 4318).
	Protocol string `yaml:"protocol"`
	// Insecure sends plaintext (no TLS); otherwise TLS verified against the
	// system roots or CAFile.
	Insecure bool              `yaml:"insecure"`
	CAFile   string            `yaml:"ca_file"` // PEM bundle that signs the receiver's certificate
	Headers  map[string]string `yaml:"headers"` // go with every export request (e.g. an auth token)
	// HeadersFile holds more headers, KEY=VALUE a line (blank lines and
	// # comments skipped), read at start: secrets stay off the command
	// line. Headers wins for a name in both.
	HeadersFile string        `yaml:"headers_file"`
	Interval    time.Duration `yaml:"interval"` // the OTLP push period; 0: DefaultInterval
	// PrometheusListen, when set (HOST:PORT), serves GET /metrics in the
	// Prometheus text format.
	PrometheusListen string `yaml:"prometheus_listen"`
	// PrometheusGate, when set, keeps the series it names private to the
	// scrapes it authorizes (set by the program, not configuration).
	PrometheusGate *PrometheusGate `yaml:"-"`
}

// Enabled reports whether anything is exported.
func (c Config) Enabled() bool { return c.Endpoint != "" || c.PrometheusListen != "" }

// protocol returns the protocol with its default applied.
func (c Config) protocol() string { return cmp.Or(c.Protocol, ProtocolGRPC) }

// interval returns the push interval with its default applied.
func (c Config) interval() time.Duration { return cmp.Or(c.Interval, DefaultInterval) }

// Validate reports every problem at once.
func (c Config) Validate() error {
	var errs []error
	if c.Endpoint != "" {
		if _, _, err := net.SplitHostPort(c.Endpoint); err != nil {
			errs = append(errs, fmt.Errorf("otlp endpoint %q: want HOST:PORT: %v", c.Endpoint, err))
		}
	} else if c.Insecure || c.CAFile != "" || len(c.Headers) > 0 || c.HeadersFile != "" || c.Protocol != "" {
		errs = append(errs, errors.New("otlp settings given without an otlp endpoint"))
	}
	switch c.Protocol {
	case "", ProtocolGRPC, ProtocolHTTP:
	default:
		errs = append(errs, fmt.Errorf("otlp protocol %q: want grpc or http", c.Protocol))
	}
	if c.Insecure && c.CAFile != "" {
		errs = append(errs, errors.New("otlp: insecure and a CA file exclude each other"))
	}
	if c.CAFile != "" {
		if _, err := os.Stat(c.CAFile); err != nil {
			errs = append(errs, fmt.Errorf("otlp CA file: %v", err))
		}
	}
	headers, err := c.AllHeaders()
	if err != nil {
		errs = append(errs, err)
	}
	for k := range headers {
		if k == "" || strings.ContainsAny(k, " \t\r\n:") {
			errs = append(errs, fmt.Errorf("otlp header name %q is not a valid header name", k))
		}
	}
	if c.Interval < 0 || (c.Interval > 0 && c.Interval < 100*time.Millisecond) || c.Interval > time.Hour {
		errs = append(errs, fmt.Errorf("otlp interval %v: want between 100ms and 1h", c.Interval))
	}
	if c.PrometheusListen != "" {
		if _, _, err := net.SplitHostPort(c.PrometheusListen); err != nil {
			errs = append(errs, fmt.Errorf("prometheus listen %q: want HOST:PORT: %v", c.PrometheusListen, err))
		}
	}
	return errors.Join(errs...)
}

// Flags binds the export settings to command-line flags (the same names on
// `trainmeter serve` and `trainmeter-agent`).
type Flags struct {
	cfg     *Config
	headers []string
}

// BindFlags defines the --otlp-* and --prometheus-listen flags on fs, filling
// cfg. Call Apply after parsing to turn the repeatable headers into the map.
func BindFlags(fs *pflag.FlagSet, cfg *Config) *Flags {
	f := &Flags{cfg: cfg}
	fs.StringVar(&cfg.Endpoint, "otlp-endpoint", cfg.Endpoint, "push metrics (and alert logs) over OTLP to HOST:PORT (empty: off)")
	fs.StringVar(&cfg.Protocol, "otlp-protocol", cfg.Protocol, "OTLP protocol: grpc or http (default grpc)")
	fs.BoolVar(&cfg.Insecure, "otlp-insecure", cfg.Insecure, "OTLP without TLS")
	fs.StringVar(&cfg.CAFile, "otlp-ca", cfg.CAFile, "verify the OTLP receiver's certificate with this PEM CA bundle")
	fs.StringArrayVar(&f.headers, "otlp-header", nil, "header KEY=VALUE sent with every OTLP request (repeatable; visible in ps: prefer --otlp-headers-file for secrets)")
	fs.StringVar(&cfg.HeadersFile, "otlp-headers-file", cfg.HeadersFile, "file of headers KEY=VALUE, one a line, sent with every OTLP request (keeps tokens off the command line)")
	fs.DurationVar(&cfg.Interval, "otlp-interval", cfg.Interval, "OTLP push interval (default 15s)")
	fs.StringVar(&cfg.PrometheusListen, "prometheus-listen", cfg.PrometheusListen, "serve Prometheus GET /metrics on HOST:PORT (empty: off)")
	return f
}

// Apply parses the --otlp-header values into the config (over any headers
// it already has, e.g. from a config file).
func (f *Flags) Apply() error {
	h, err := ParseHeaders(f.headers)
	if err != nil {
		return err
	}
	if len(h) > 0 && f.cfg.Headers == nil {
		f.cfg.Headers = map[string]string{}
	}
	maps.Copy(f.cfg.Headers, h)
	return nil
}

// ParseHeaders parses KEY=VALUE pairs.
func ParseHeaders(kvs []string) (map[string]string, error) {
	out := map[string]string{}
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		k = strings.TrimSpace(k)
		if !ok || k == "" {
			return nil, fmt.Errorf("otlp header %q: want KEY=VALUE", kv)
		}
		out[k] = v
	}
	return out, nil
}

// AllHeaders is the headers every export sends: HeadersFile's, then
// Headers over them (a header given directly wins).
func (c Config) AllHeaders() (map[string]string, error) {
	out := map[string]string{}
	if c.HeadersFile != "" {
		b, err := os.ReadFile(c.HeadersFile)
		if err != nil {
			return nil, fmt.Errorf("otlp headers file: %w", err)
		}
		for i, line := range strings.Split(string(b), "\n") {
			line = strings.TrimSpace(line)
			if line == "" || strings.HasPrefix(line, "#") {
				continue
			}
			k, v, ok := strings.Cut(line, "=")
			if k = strings.TrimSpace(k); !ok || k == "" {
				// The line is not quoted: it may hold the secret.
				return nil, fmt.Errorf("otlp headers file %s line %d: want KEY=VALUE", c.HeadersFile, i+1)
			}
			out[k] = strings.TrimSpace(v)
		}
	}
	maps.Copy(out, c.Headers)
	return out, nil
}
