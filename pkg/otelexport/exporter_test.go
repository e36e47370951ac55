package otelexport

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	colmetricspb "go.opentelemetry.io/proto/otlp/collector/metrics/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

var testResource = Resource{ServiceName: "trainmeter-collector", ServiceVersion: "1.2.3", InstanceID: "host/:7070", HostName: "host"}

func resourceAttrs(t *testing.T, ctx context.Context) map[string]string {
	t.Helper()
	rsc, err := testResource.resource(ctx)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, kv := range rsc.Attributes() {
		out[string(kv.Key)] = kv.Value.String()
	}
	return out
}

// Without the OTEL_* variables the resource is exactly trainmeter's.
func TestResourceWithoutEnvironment(t *testing.T) {
	t.Setenv("OTEL_RESOURCE_ATTRIBUTES", "")
	t.Setenv("OTEL_SERVICE_NAME", "")
	got := resourceAttrs(t, context.Background())
	want := map[string]string{"service.name": "trainmeter-collector", "service.version": "1.2.3",
		"service.instance.id": "host/:7070", "host.name": "host"}
	if len(got) != len(want) {
		t.Fatalf("resource %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}
}

// OTEL_RESOURCE_ATTRIBUTES adds attributes and, like OTEL_SERVICE_NAME,
// wins over trainmeter's own for the same key. (The SDK's WithResource
// alone merges the variables' extra attributes but lets trainmeter's
// service.name and service.instance.id win, ignoring OTEL_SERVICE_NAME.)
func TestResourceFromEnvironment(t *testing.T) {
	t.Setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment.name=prod,k8s.cluster.name=gpu-a,service.instance.id=from-env")
	t.Setenv("OTEL_SERVICE_NAME", "fleet-collector")
	got := resourceAttrs(t, context.Background())
	for k, v := range map[string]string{
		"service.name": "fleet-collector", "service.instance.id": "from-env", // env wins
		"deployment.environment.name": "prod", "k8s.cluster.name": "gpu-a", // env adds
		"host.name": "host", "service.version": "1.2.3", // ours stay
	} {
		if got[k] != v {
			t.Errorf("%s = %q, want %q (resource %v)", k, got[k], v, got)
		}
	}

	// And it is what goes out: target_info on the Prometheus endpoint.
	e, err := Start(context.Background(), Config{PrometheusListen: "127.0.0.1:0"}, testResource, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Shutdown(context.Background())
	resp, err := http.Get("http://" + e.PrometheusAddr().String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var info string
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "target_info{") {
			info = line
		}
	}
	for _, l := range []string{`deployment_environment_name="prod"`, `service_name="fleet-collector"`, `host_name="host"`} {
		if !strings.Contains(info, l) {
			t.Errorf("target_info %q lacks %s", info, l)
		}
	}
}

// A malformed OTEL_RESOURCE_ATTRIBUTES refuses the start with a clear error.
func TestResourceBadEnvironment(t *testing.T) {
	t.Setenv("OTEL_RESOURCE_ATTRIBUTES", "novalue")
	_, err := Start(context.Background(), Config{PrometheusListen: "127.0.0.1:0"}, testResource, nil)
	if err == nil || !strings.Contains(err.Error(), "OTEL_RESOURCE_ATTRIBUTES") {
		t.Fatalf("Start with OTEL_RESOURCE_ATTRIBUTES=novalue: %v, want an error naming it", err)
	}
}

// metricsRecorder is an OTLP/gRPC metrics receiver that keeps the request
// metadata (headers).
type metricsRecorder struct {
	colmetricspb.UnimplementedMetricsServiceServer
	md chan metadata.MD
}

func (r *metricsRecorder) Export(ctx context.Context, _ *colmetricspb.ExportMetricsServiceRequest) (*colmetricspb.ExportMetricsServiceResponse, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	select {
	case r.md <- md:
	default:
	}
	return &colmetricspb.ExportMetricsServiceResponse{}, nil
}

// --otlp-header values go with every OTLP/gRPC export as request metadata
// (OTLP/HTTP: collector/internal/telemetry's TestHeadersAreSent).
func TestOTLPGRPCHeadersAreSent(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	rec := &metricsRecorder{md: make(chan metadata.MD, 16)}
	colmetricspb.RegisterMetricsServiceServer(srv, rec)
	go func() { _ = srv.Serve(ln) }()
	defer srv.Stop()

	ctx := context.Background()
	e, err := Start(ctx, Config{Endpoint: ln.Addr().String(), Insecure: true,
		Headers: map[string]string{"Authorization": "Bearer s3cret", "X-Tenant": "ml"}}, testResource, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Shutdown(ctx)
	c, err := e.Meter().Int64ObservableCounter("test.counter")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Meter().RegisterCallback(func(_ context.Context, o metric.Observer) error {
		o.ObserveInt64(c, 1, metric.WithAttributes(attribute.String("k", "v")))
		return nil
	}, c); err != nil {
		t.Fatal(err)
	}
	if err := e.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case md := <-rec.md:
		if got := md.Get("authorization"); len(got) != 1 || got[0] != "Bearer s3cret" {
			t.Errorf("authorization metadata %v, want Bearer s3cret", got)
		}
		if got := md.Get("x-tenant"); len(got) != 1 || got[0] != "ml" {
			t.Errorf("x-tenant metadata %v, want ml", got)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no OTLP/gRPC export arrived")
	}
}

// Headers can come from a file (--otlp-headers-file, headers_file:), so a
// secret is not on the command line: KEY=VALUE lines, blank lines and #
// comments skipped; a header given directly wins over the file's. A missing
// or malformed file refuses the start, naming the file and line.
func TestOTLPHeadersFromFile(t *testing.T) {
	dir := t.TempDir()
	file := dir + "/otlp-headers"
	if err := os.WriteFile(file, []byte("# the receiver's token\nAuthorization=Bearer from-file\n\nX-Tenant = file-tenant\nX-Scope=a=b\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := Config{HeadersFile: file, Headers: map[string]string{"X-Tenant": "flag-tenant"}}.AllHeaders()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"Authorization": "Bearer from-file", "X-Tenant": "flag-tenant", "X-Scope": "a=b"}
	if len(got) != len(want) {
		t.Errorf("headers %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("header %s = %q, want %q", k, got[k], v)
		}
	}

	bad := dir + "/bad"
	if err := os.WriteFile(bad, []byte("Authorization=x\nno equals sign\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for cfg, msg := range map[*Config]string{
		{Endpoint: "127.0.0.1:4317", HeadersFile: bad}:              bad + " line 2",
		{Endpoint: "127.0.0.1:4317", HeadersFile: dir + "/missing"}: "missing",
		{HeadersFile: file, PrometheusListen: "127.0.0.1:0"}:        "without an otlp endpoint",
	} {
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), msg) {
			t.Errorf("Validate(%+v) = %v, want an error naming %q", *cfg, err, msg)
		}
	}

	// And they go out with the exports.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	rec := &metricsRecorder{md: make(chan metadata.MD, 16)}
	colmetricspb.RegisterMetricsServiceServer(srv, rec)
	go func() { _ = srv.Serve(ln) }()
	defer srv.Stop()
	ctx := context.Background()
	e, err := Start(ctx, Config{Endpoint: ln.Addr().String(), Insecure: true, HeadersFile: file}, testResource, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Shutdown(ctx)
	c, _ := e.Meter().Int64Counter("test.file_headers")
	c.Add(ctx, 1)
	if err := e.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case md := <-rec.md:
		if got := md.Get("authorization"); len(got) != 1 || got[0] != "Bearer from-file" {
			t.Errorf("authorization metadata %v, want the file's", got)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no OTLP/gRPC export arrived")
	}
}
