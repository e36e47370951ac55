package main

import (
	"strings"
	"testing"
	"time"

	"github.com/trainmeter/trainmeter/agent/internal/agentconfig"
)

// The otel: block of the config file and the --otlp-*/--prometheus-listen
// flags (which win) fill the agent's export settings.
func TestOTelSettingsFromFileAndFlags(t *testing.T) {
	path := writeConfig(t, "collector: c:7433\notel:\n  endpoint: otel-file:4317\n  insecure: true\n  interval: 30s\n  headers:\n    x-from-file: a\n")
	o := &options{cfg: agentconfig.DefaultConfig()}
	cmd := newRootCmdWith(o)
	if err := cmd.ParseFlags([]string{"--config", path, "--otlp-endpoint", "otel-flag:4318", "--otlp-protocol", "http",
		"--otlp-header", "authorization=Bearer t", "--prometheus-listen", "127.0.0.1:9465"}); err != nil {
		t.Fatal(err)
	}
	cfg, err := o.load(cmd)
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	c := cfg.OTel
	if c.Endpoint != "otel-flag:4318" || c.Protocol != "http" || !c.Insecure || c.Interval != 30*time.Second ||
		c.Headers["authorization"] != "Bearer t" || c.PrometheusListen != "127.0.0.1:9465" {
		t.Fatalf("otel settings %+v", c)
	}

	o = &options{cfg: agentconfig.DefaultConfig()}
	cmd = newRootCmdWith(o)
	if err := cmd.ParseFlags([]string{"--otlp-endpoint", "nohost", "--otlp-protocol", "udp"}); err != nil {
		t.Fatal(err)
	}
	cfg, err = o.load(cmd)
	if err != nil {
		t.Fatal(err)
	}
	err = cfg.Validate()
	if err == nil || !strings.Contains(err.Error(), "otlp endpoint") || !strings.Contains(err.Error(), "want grpc or http") {
		t.Fatalf("bad otel flags: %v", err)
	}
}
