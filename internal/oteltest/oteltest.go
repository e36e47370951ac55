// Package oteltest runs real observability peers for tests: an
// OpenTelemetry Collector (built by scripts/otelcol-build.sh) that writes
// what it receives to files, and Prometheus with promtool (Debian package).
//
// A test that needs a peer skips when it is absent, and fails instead when
// TRAINMETER_REQUIRE_OTEL=1 (CI sets it). The collector binary is
// $TRAINMETER_OTELCOL, else the one scripts/otelcol-build.sh has cached.
package oteltest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	logspb "go.opentelemetry.io/proto/otlp/logs/v1"
	metricspb "go.opentelemetry.io/proto/otlp/metrics/v1"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/trainmeter/trainmeter/internal/testkit"
)

// Required reports whether missing peers fail the test instead of skipping it.
func Required() bool { return os.Getenv("TRAINMETER_REQUIRE_OTEL") == "1" }

// missing skips, or fails under TRAINMETER_REQUIRE_OTEL=1.
func missing(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if Required() {
		t.Fatalf("%s (TRAINMETER_REQUIRE_OTEL=1)", msg)
	}
	t.Skip(msg + " (set TRAINMETER_REQUIRE_OTEL=1 to fail instead)")
}

// RepoRoot is the directory of the module's go.mod.
func RepoRoot(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("go.mod not found above the test's directory")
		}
		dir = parent
	}
}

// OtelcolBinary returns the OpenTelemetry Collector to test against.
func OtelcolBinary(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("TRAINMETER_OTELCOL"); p != "" {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("TRAINMETER_OTELCOL=%s: %v", p, err)
		}
		return p
	}
	out, err := exec.Command(filepath.Join(RepoRoot(t), "scripts", "otelcol-build.sh"), "--cached-only").Output()
	if err != nil {
		missing(t, "no OpenTelemetry Collector built: run scripts/otelcol-build.sh or set TRAINMETER_OTELCOL")
	}
	return strings.TrimSpace(string(out))
}

// Tool returns the path of a command on PATH (prometheus, promtool).
func Tool(t testing.TB, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		missing(t, "%s is not installed (apt-get install prometheus)", name)
	}
	return p
}

// Start runs a command until the test ends (SIGINT, then kill), showing
// its output if the test failed.
func Start(t testing.TB, name, bin string, args ...string) *exec.Cmd {
	t.Helper()
	return StartEnv(t, name, bin, nil, args...)
}

// StartEnv is Start with extra environment variables (KEY=VALUE).
func StartEnv(t testing.TB, name, bin string, env []string, args ...string) *exec.Cmd {
	t.Helper()
	logPath := filepath.Join(t.TempDir(), name+".log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		logf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("--- %s log ---\n%s", name, b)
		}
	})
	return cmd
}

// Eventually polls ok until it holds or timeout passes.
func Eventually(t testing.TB, timeout time.Duration, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Collector is a running OpenTelemetry Collector with an OTLP receiver
// (gRPC and HTTP) whose metrics and logs go to JSON-lines files.
type Collector struct {
	GRPC, HTTP            string // receiver endpoints HOST:PORT
	MetricsFile, LogsFile string
}

// StartCollector starts the collector and waits until it listens.
func StartCollector(t testing.TB) *Collector {
	t.Helper()
	return StartCollectorWith(t, CollectorOptions{})
}

// CollectorOptions configure StartCollectorWith.
type CollectorOptions struct {
	// TLSCert and TLSKey, when set, make both receivers serve TLS.
	TLSCert, TLSKey string
}

// StartCollectorWith starts the collector with o and waits until it listens.
func StartCollectorWith(t testing.TB, o CollectorOptions) *Collector {
	t.Helper()
	bin := OtelcolBinary(t)
	dir := t.TempDir()
	c := &Collector{GRPC: testkit.FreeAddr(t), HTTP: testkit.FreeAddr(t),
		MetricsFile: filepath.Join(dir, "metrics.jsonl"), LogsFile: filepath.Join(dir, "logs.jsonl")}
	tls := ""
	if o.TLSCert != "" {
		tls = fmt.Sprintf("\n        tls:\n          cert_file: %s\n          key_file: %s", o.TLSCert, o.TLSKey)
	}
	cfg := fmt.Sprintf(`receivers:
  otlp:
    protocols:
      grpc:
        endpoint: %s%s
      http:
        endpoint: %s%s
exporters:
  file/metrics:
    path: %s
    flush_interval: 100ms
  file/logs:
    path: %s
    flush_interval: 100ms
service:
  telemetry:
    metrics:
      level: none
  pipelines:
    metrics:
      receivers: [otlp]
      exporters: [file/metrics]
    logs:
      receivers: [otlp]
      exporters: [file/logs]
`, c.GRPC, tls, c.HTTP, tls, c.MetricsFile, c.LogsFile)
	cfgPath := filepath.Join(dir, "otelcol.yaml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	Start(t, "otelcol", bin, "--config", cfgPath)
	Eventually(t, 30*time.Second, "otelcol listening", func() bool {
		for _, a := range []string{c.GRPC, c.HTTP} {
			conn, err := net.DialTimeout("tcp", a, time.Second)
			if err != nil {
				return false
			}
			conn.Close()
		}
		return true
	})
	return c
}

// Point is one data point as it arrived at the collector.
type Point struct {
	Resource map[string]string
	Scope    string
	Name     string
	Unit     string
	// Kind: "gauge" or "sum".
	Kind        string
	Monotonic   bool
	Cumulative  bool
	Attrs       map[string]string
	Value       float64
	Time, Start time.Time
}

// Metrics returns every data point in the metrics file, in arrival order.
func (c *Collector) Metrics(t testing.TB) []Point {
	t.Helper()
	var out []Point
	for _, line := range readLines(t, c.MetricsFile) {
		var md metricspb.MetricsData
		if err := protojson.Unmarshal(line, &md); err != nil {
			t.Fatalf("metrics file line is not OTLP JSON: %v\n%s", err, line)
		}
		for _, rm := range md.GetResourceMetrics() {
			res := attrMap(rm.GetResource().GetAttributes())
			for _, sm := range rm.GetScopeMetrics() {
				for _, m := range sm.GetMetrics() {
					base := Point{Resource: res, Scope: sm.GetScope().GetName(), Name: m.GetName(), Unit: m.GetUnit()}
					var dps []*metricspb.NumberDataPoint
					switch d := m.GetData().(type) {
					case *metricspb.Metric_Gauge:
						base.Kind, dps = "gauge", d.Gauge.GetDataPoints()
					case *metricspb.Metric_Sum:
						base.Kind, dps = "sum", d.Sum.GetDataPoints()
						base.Monotonic = d.Sum.GetIsMonotonic()
						base.Cumulative = d.Sum.GetAggregationTemporality() == metricspb.AggregationTemporality_AGGREGATION_TEMPORALITY_CUMULATIVE
					default:
						t.Fatalf("metric %s: unexpected data type %T", m.GetName(), d)
					}
					for _, dp := range dps {
						p := base
						p.Attrs = attrMap(dp.GetAttributes())
						switch v := dp.GetValue().(type) {
						case *metricspb.NumberDataPoint_AsDouble:
							p.Value = v.AsDouble
						case *metricspb.NumberDataPoint_AsInt:
							p.Value = float64(v.AsInt)
						}
						p.Time = time.Unix(0, int64(dp.GetTimeUnixNano()))
						p.Start = time.Unix(0, int64(dp.GetStartTimeUnixNano()))
						out = append(out, p)
					}
				}
			}
		}
	}
	return out
}

// LogRecord is one log record as it arrived at the collector.
type LogRecord struct {
	Resource     map[string]string
	EventName    string
	Severity     string
	SeverityText string
	Body         string
	Attrs        map[string]string
	Time         time.Time
}

// Logs returns every log record in the logs file.
func (c *Collector) Logs(t testing.TB) []LogRecord {
	t.Helper()
	var out []LogRecord
	for _, line := range readLines(t, c.LogsFile) {
		var ld logspb.LogsData
		if err := protojson.Unmarshal(line, &ld); err != nil {
			t.Fatalf("logs file line is not OTLP JSON: %v\n%s", err, line)
		}
		for _, rl := range ld.GetResourceLogs() {
			res := attrMap(rl.GetResource().GetAttributes())
			for _, sl := range rl.GetScopeLogs() {
				for _, r := range sl.GetLogRecords() {
					out = append(out, LogRecord{Resource: res, EventName: r.GetEventName(), Severity: r.GetSeverityNumber().String(),
						SeverityText: r.GetSeverityText(), Body: r.GetBody().GetStringValue(), Attrs: attrMap(r.GetAttributes()),
						Time: time.Unix(0, int64(r.GetTimeUnixNano()))})
				}
			}
		}
	}
	return out
}

func readLines(t testing.TB, path string) [][]byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var out [][]byte
	for line := range bytes.Lines(b) {
		// The file exporter may be mid-write: only complete JSON objects
		// count.
		if line = bytes.TrimSpace(line); len(line) > 0 && line[0] == '{' && line[len(line)-1] == '}' {
			out = append(out, line)
		}
	}
	return out
}

func attrMap(kvs []*commonpb.KeyValue) map[string]string {
	out := map[string]string{}
	for _, kv := range kvs {
		if sv, ok := kv.GetValue().GetValue().(*commonpb.AnyValue_StringValue); ok {
			out[kv.GetKey()] = sv.StringValue
		} else {
			out[kv.GetKey()] = protojson.Format(kv.GetValue())
		}
	}
	return out
}

// Latest returns, for each distinct attribute set of metric name, its most
// recent point (keyed by the sorted attributes).
func Latest(points []Point, name string) map[string]Point {
	out := map[string]Point{}
	for _, p := range points {
		if p.Name != name {
			continue
		}
		k := AttrKey(p.Attrs)
		if old, ok := out[k]; !ok || !p.Time.Before(old.Time) {
			out[k] = p
		}
	}
	return out
}

// AttrKey is a stable text form of an attribute map.
func AttrKey(m map[string]string) string {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(m)) {
		fmt.Fprintf(&b, "%s=%q,", k, m[k])
	}
	return b.String()
}

// PromQuery runs `promtool query instant -o json` against a Prometheus and
// returns each series' labels and value.
func PromQuery(ctx context.Context, promtool, server, expr string) ([]PromSample, error) {
	out, err := exec.CommandContext(ctx, promtool, "query", "instant", "-o", "json", server, expr).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return nil, fmt.Errorf("promtool query %q: %v: %s", expr, err, ee.Stderr)
		}
		return nil, err
	}
	return parsePromJSON(out)
}
