package server_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/trainmeter/trainmeter/collector/internal/server"
	tu "github.com/trainmeter/trainmeter/collector/internal/testutil"
	"github.com/trainmeter/trainmeter/pkg/otelexport"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

func TestOTelConfigIsValidated(t *testing.T) {
	srv := server.New(server.Config{Listen: "127.0.0.1:0", DataDir: t.TempDir(), OTel: otelexport.Config{Endpoint: "no-port"}}, quiet())
	err := srv.Start(t.Context())
	if err == nil || !strings.Contains(err.Error(), "otlp endpoint") {
		t.Fatalf("Start with a bad OTLP endpoint: %v", err)
	}
	if srv.Telemetry() != nil {
		t.Fatal("telemetry set after a failed start")
	}
}

// With --prometheus-listen, a batch the collector applies shows up on
// /metrics (wired through the ingest hook), and Shutdown closes the endpoint.
func TestPrometheusEndpointServesAppliedBatches(t *testing.T) {
	srv := server.New(server.Config{Listen: "127.0.0.1:0", DataDir: t.TempDir(), Now: tu.Now,
		OTel: otelexport.Config{PrometheusListen: "127.0.0.1:0"}}, quiet())
	if err := srv.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	addr := srv.Telemetry().PrometheusAddr().String()
	conn := tu.Dial(t, srv.Addr().String())
	n := tu.Connect(t, conn, "node-1", "boot-a")
	b := tu.Batch(1, 0, []*trainmeterv1.RunWindow{tu.Window("run-1", 0, 1000, 300)}, tu.Start("run-1", 0, "llama"))
	n.MustAck(b)

	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	text := string(body)
	for _, want := range []string{`trainmeter_run_tokens_total{`, `trainmeter_run_id="run-1"`, `trainmeter_run_model="llama"`, `trainmeter_agent_connected{`} {
		if !strings.Contains(text, want) {
			t.Errorf("/metrics lacks %s:\n%s", want, text)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := http.Get("http://" + addr + "/metrics"); err == nil {
		t.Fatal("/metrics still served after Shutdown")
	}
}
