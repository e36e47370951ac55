package otelexport

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

func TestValidate(t *testing.T) {
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		cfg  Config
		want string // "" = valid
	}{
		{"zero value exports nothing", Config{}, ""},
		{"grpc", Config{Endpoint: "otel:4317", Insecure: true, Interval: time.Second}, ""},
		{"http with CA and headers", Config{Endpoint: "otel:4318", Protocol: "http", CAFile: ca, Headers: map[string]string{"Authorization": "Bearer x"}}, ""},
		{"prometheus only", Config{PrometheusListen: ":9464"}, ""},
		{"endpoint without port", Config{Endpoint: "otel"}, "want HOST:PORT"},
		{"bad protocol", Config{Endpoint: "otel:4317", Protocol: "udp"}, "want grpc or http"},
		{"settings without endpoint", Config{Insecure: true}, "without an otlp endpoint"},
		{"insecure and CA", Config{Endpoint: "otel:4317", Insecure: true, CAFile: ca}, "exclude each other"},
		{"missing CA", Config{Endpoint: "otel:4317", CAFile: "/nonexistent/ca.pem"}, "CA file"},
		{"bad header", Config{Endpoint: "otel:4317", Headers: map[string]string{"a b": "x"}}, "not a valid header name"},
		{"interval too short", Config{Endpoint: "otel:4317", Interval: time.Millisecond}, "between 100ms and 1h"},
		{"bad prometheus listen", Config{PrometheusListen: "9464"}, "prometheus listen"},
	} {
		err := c.cfg.Validate()
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: %v", c.name, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s: error %v, want one containing %q", c.name, err, c.want)
		}
	}
}

func TestFlags(t *testing.T) {
	var cfg Config
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	f := BindFlags(fs, &cfg)
	if err := fs.Parse([]string{"--otlp-endpoint", "h:4317", "--otlp-insecure", "--otlp-interval", "2s",
		"--otlp-header", "a=1", "--otlp-header", "b=x=y", "--prometheus-listen", "127.0.0.1:9464"}); err != nil {
		t.Fatal(err)
	}
	if err := f.Apply(); err != nil {
		t.Fatal(err)
	}
	if cfg.Endpoint != "h:4317" || !cfg.Insecure || cfg.Interval != 2*time.Second || cfg.Headers["a"] != "1" || cfg.Headers["b"] != "x=y" || cfg.PrometheusListen != "127.0.0.1:9464" {
		t.Fatalf("flags gave %+v", cfg)
	}
	if _, err := ParseHeaders([]string{"novalue"}); err == nil {
		t.Fatal("header without = accepted")
	}
}

func TestVendor(t *testing.T) {
	for model, want := range map[string]string{
		"NVIDIA H100 80GB HBM3": "NVIDIA", "Tesla V100-SXM2-16GB": "NVIDIA", "Simulated H100 80GB HBM3": "NVIDIA",
		"AMD Instinct MI300X": "AMD", "Replay GPU": "unknown", "GH100X": "unknown",
	} {
		if got := Vendor(model); got != want {
			t.Errorf("Vendor(%q) = %q, want %q", model, got, want)
		}
	}
}

// The vendor the agent names wins over the guess from the model name (a
// replayed AMD trace is "Replay GPU"; an AMD card without a FRU name is
// named by its PCI id).
func TestGPUVendorFromTheAgent(t *testing.T) {
	cases := []struct {
		info *trainmeterv1.GpuInfo
		want string
	}{
		{&trainmeterv1.GpuInfo{Name: "Replay GPU", Vendor: "amd"}, "AMD"},
		{&trainmeterv1.GpuInfo{Name: "AMD GPU [1002:7551]", Vendor: "amd"}, "AMD"},
		{&trainmeterv1.GpuInfo{Name: "Replay GPU", Vendor: "nvidia"}, "NVIDIA"},
		{&trainmeterv1.GpuInfo{Name: "NVIDIA H100 80GB HBM3"}, "NVIDIA"},
		{&trainmeterv1.GpuInfo{Name: "Replay GPU"}, "unknown"},
	}
	for _, c := range cases {
		if got := gpuVendor(c.info); got != c.want {
			t.Errorf("gpuVendor(%v) = %q, want %q", c.info, got, c.want)
		}
	}
}
