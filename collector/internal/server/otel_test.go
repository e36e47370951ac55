package server_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
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

// With --prometheus-listen (and the run-level series opted in), a batch
// the collector applies shows up on /metrics (wired through the ingest
// hook), and Shutdown closes the endpoint.
func TestPrometheusEndpointServesAppliedBatches(t *testing.T) {
	srv := server.New(server.Config{Listen: "127.0.0.1:0", DataDir: t.TempDir(), Clock: tu.Clock(),
		OTel: otelexport.Config{PrometheusListen: "127.0.0.1:0"}, PrometheusRunMetrics: true}, quiet())
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

// TestPrometheusRunSeriesNeedTheReadToken: by default /metrics shows no
// run-level series (run ids, models, budget scopes) to a scrape without a
// token or with a wrong one; the read and the
// admin token see them; node-level series (GPUs, agents) are open. On a
// collector without query tokens they are shown only with the explicit
// opt-in (PrometheusRunMetrics), which shows them to every scrape.
func TestPrometheusRunSeriesNeedTheReadToken(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "read"), tokRead+"\n")
	writeFile(t, filepath.Join(dir, "admin"), tokAdmin+"\n")
	scrape := func(addr, tok string) string {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, "http://"+addr+"/metrics", nil)
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("/metrics with token %q: %s", tok, resp.Status)
		}
		return string(body)
	}
	run := func(cfg server.Config, node string) string {
		t.Helper()
		cfg.Listen, cfg.DataDir, cfg.Clock = "127.0.0.1:0", t.TempDir(), tu.Clock()
		cfg.OTel = otelexport.Config{PrometheusListen: "127.0.0.1:0"}
		srv := start(t, cfg)
		conn := tu.Dial(t, srv.Addr().String())
		n := tu.Connect(t, conn, node, "boot-a")
		n.MustAck(tu.Batch(1, 0, []*trainmeterv1.RunWindow{tu.Window("secret-run", 0, 1000, 300)}, tu.Start("secret-run", 0, "secret-model")))
		return srv.Telemetry().PrometheusAddr().String()
	}
	private := []string{`trainmeter_run_id="secret-run"`, `trainmeter_run_model="secret-model"`, `trainmeter_run_tokens_total{`}
	public := []string{`trainmeter_agent_connected{`, `trainmeter_node="node-1"`}
	check := func(what, text string, wantPrivate bool) {
		t.Helper()
		for _, s := range private {
			if strings.Contains(text, s) != wantPrivate {
				t.Errorf("%s: %s on /metrics is %v, want %v", what, s, !wantPrivate, wantPrivate)
			}
		}
		for _, s := range public {
			if !strings.Contains(text, s) {
				t.Errorf("%s: /metrics lacks the node-level %s", what, s)
			}
		}
	}

	addr := run(server.Config{ReadTokenFile: filepath.Join(dir, "read"), AdminTokenFile: filepath.Join(dir, "admin")}, "node-1")
	for tok, want := range map[string]bool{"": false, tokWrong: false, tokRead: true, tokAdmin: true} {
		check(fmt.Sprintf("tokens configured, scrape with %q", tok), scrape(addr, tok), want)
	}

	open := run(server.Config{}, "node-1")
	check("no tokens, no opt-in", scrape(open, ""), false)
	optIn := run(server.Config{PrometheusRunMetrics: true}, "node-1")
	check("no tokens, opt-in", scrape(optIn, ""), true)
}
