package telemetry

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/trainmeter/trainmeter/collector/internal/ingest"
	"github.com/trainmeter/trainmeter/collector/internal/store"
	"github.com/trainmeter/trainmeter/internal/oteltest"
	"github.com/trainmeter/trainmeter/internal/testkit"
	"github.com/trainmeter/trainmeter/pkg/clock"
	"github.com/trainmeter/trainmeter/pkg/otelexport"
	"github.com/trainmeter/trainmeter/pkg/tlsfiles/tlstest"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, append(testkit.GoleakOptions(),
		// badger's and the SDK's process-wide background goroutines.
		goleak.IgnoreAnyFunction("github.com/dgraph-io/ristretto/v2/z.(*Closer).WaitForShutdown"),
		goleak.IgnoreAnyFunction("go.opencensus.io/stats/view.(*worker).start"),
	)...)
}

// budgets and recs are small real sources, as the budget and advice
// packages will provide.
type budgets struct {
	mu  sync.Mutex
	use []BudgetUse
}

func (b *budgets) BudgetUse() []BudgetUse {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]BudgetUse(nil), b.use...)
}

type recs struct {
	mu     sync.Mutex
	counts map[string]int
}

func (r *recs) issue(kind string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.counts[kind]++
}

func (r *recs) Counts() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]int{}
	for k, v := range r.counts {
		out[k] = v
	}
	return out
}

func startTelemetry(t *testing.T, cfg otelexport.Config, clk clock.Clock) (*Telemetry, *store.Store) {
	t.Helper()
	return startTelemetryWith(t, cfg, clk, nil, nil)
}

func startTelemetryWith(t *testing.T, cfg otelexport.Config, clk clock.Clock, b BudgetSource, r RecommendationSource) (*Telemetry, *store.Store) {
	t.Helper()
	st, err := store.Open(t.TempDir(), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	exp, err := otelexport.Start(context.Background(), cfg, otelexport.Resource{ServiceName: "trainmeter-collector", InstanceID: "test"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	tel, err := New(Options{Exporter: exp, Runs: st, Nodes: ingest.New(st, nil), Clock: clk, MaxRuns: 2, RunWindow: time.Minute,
		Budgets: b, Recommendations: r})
	if err != nil {
		_ = exp.Shutdown(context.Background())
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := tel.Shutdown(context.Background()); err != nil {
			t.Error(err)
		}
	})
	return tel, st
}

func scrape(t *testing.T, tel *Telemetry) string {
	t.Helper()
	resp, err := http.Get("http://" + tel.PrometheusAddr().String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// sample returns the value line of a series whose line contains every part.
func sample(text, name string, parts ...string) (string, bool) {
	for _, line := range strings.Split(text, "\n") {
		if !strings.HasPrefix(line, name+"{") {
			continue
		}
		ok := true
		for _, p := range parts {
			ok = ok && strings.Contains(line, p)
		}
		if ok {
			return line[strings.LastIndex(line, " ")+1:], true
		}
	}
	return "", false
}

func TestSourcesReachPrometheus(t *testing.T) {
	tel, _ := startTelemetry(t, otelexport.Config{PrometheusListen: "127.0.0.1:0"}, nil)
	text := scrape(t, tel)
	if strings.Contains(text, "trainmeter_budget_use_ratio") || strings.Contains(text, "trainmeter_recommendations_total") {
		t.Fatalf("budget or recommendation series without a source:\n%s", text)
	}

	b := &budgets{use: []BudgetUse{{Scope: "team-a", Period: "month", Ratio: 0.42}, {Scope: "llama", Period: "total", Ratio: 1.25}}}
	r := &recs{counts: map[string]int{}}
	r.issue("dataloader")
	r.issue("dataloader")
	r.issue("stop")
	tel, _ = startTelemetryWith(t, otelexport.Config{PrometheusListen: "127.0.0.1:0"}, nil, b, r)
	text = scrape(t, tel)
	for _, c := range []struct{ name, want string }{
		{`trainmeter_budget_use_ratio trainmeter_budget_scope="team-a" trainmeter_budget_period="month"`, "0.42"},
		{`trainmeter_budget_use_ratio trainmeter_budget_scope="llama" trainmeter_budget_period="total"`, "1.25"},
		{`trainmeter_recommendations_total trainmeter_recommendation_kind="dataloader"`, "2"},
		{`trainmeter_recommendations_total trainmeter_recommendation_kind="stop"`, "1"},
	} {
		f := strings.Fields(c.name)
		got, ok := sample(text, f[0], f[1:]...)
		if !ok || got != c.want {
			t.Errorf("%s = %q (found %v), want %s", c.name, got, ok, c.want)
		}
	}
	// Every "source" name deploy/grafana/metrics.txt lists is now exported.
	_, sourced := oteltest.DashboardMetrics(t)
	for _, name := range sourced {
		if !strings.Contains(text, "\n"+name+"{") {
			t.Errorf("%s (deploy/grafana/metrics.txt) is not in /metrics", name)
		}
	}

	b.mu.Lock()
	b.use = nil
	b.mu.Unlock()
	if text := scrape(t, tel); strings.Contains(text, "trainmeter_budget_use_ratio{") {
		t.Errorf("budget series still exported after the budgets were gone")
	}
}

func TestNilTelemetryIsSafe(t *testing.T) {
	var tel *Telemetry
	tel.OnApplied("n", &trainmeterv1.Batch{})
	(*AlertLog)(nil).EmitAlert(context.Background(), Alert{Kind: "budget"})
	if err := tel.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := tel.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if tel.PrometheusAddr() != nil {
		t.Fatal("nil telemetry has a Prometheus address")
	}
}

// runBatch is a batch with one run window and a run_start for each run.
func runBatch(seq uint64, at time.Time, runs ...string) *trainmeterv1.Batch {
	b := &trainmeterv1.Batch{Seq: seq, WindowStart: timestamppb.New(at.Add(-time.Second)), WindowEnd: timestamppb.New(at)}
	for _, r := range runs {
		b.RunEvents = append(b.RunEvents, &trainmeterv1.RunEvent{Event: &trainmeterv1.RunEvent_RunStart{RunStart: &trainmeterv1.RunStart{RunId: r, Time: timestamppb.New(at.Add(-time.Second))}}})
		b.RunWindows = append(b.RunWindows, &trainmeterv1.RunWindow{RunId: r, Start: timestamppb.New(at.Add(-time.Second)), End: timestamppb.New(at), Tokens: 100, Gpus: []uint32{0}})
	}
	return b
}

// The exported runs are bounded: only runs with data within RunWindow, at
// most MaxRuns of them, the most recently active first; deleted runs drop out.
func TestRunCardinalityIsBounded(t *testing.T) {
	clk := clock.NewFake(time.Now().Truncate(time.Second))
	tel, st := startTelemetry(t, otelexport.Config{PrometheusListen: "127.0.0.1:0"}, clk)
	apply := func(seq uint64, runs ...string) {
		t.Helper()
		b := runBatch(seq, clk.Now(), runs...)
		if _, err := st.ApplyBatch("n", "boot", b); err != nil {
			t.Fatal(err)
		}
		tel.OnApplied("n", b)
	}
	exported := func() string {
		t.Helper()
		var ids []string
		text := scrape(t, tel)
		for _, r := range []string{"a", "b", "c"} {
			if _, ok := sample(text, "trainmeter_run_tokens_total", fmt.Sprintf(`trainmeter_run_id="%s"`, r)); ok {
				ids = append(ids, r)
			}
		}
		return strings.Join(ids, ",")
	}
	apply(1, "a")
	clk.Advance(10 * time.Second)
	apply(2, "b")
	if got := exported(); got != "a,b" {
		t.Fatalf("exported runs %q, want a,b", got)
	}
	clk.Advance(10 * time.Second)
	apply(3, "c") // a third run: MaxRuns is 2, the least recent (a) goes
	if got := exported(); got != "b,c" {
		t.Fatalf("exported runs %q, want b,c", got)
	}
	clk.Advance(55 * time.Second) // b's last data is now 65 s old, c's 55 s
	if got := exported(); got != "c" {
		t.Fatalf("exported runs %q, want c (RunWindow 1 min)", got)
	}
	if _, err := st.DeleteRun("c"); err != nil {
		t.Fatal(err)
	}
	if got := exported(); got != "" {
		t.Fatalf("exported runs %q after deleting c, want none", got)
	}
}

// An alert goes out as an OTel log record and arrives at a real
// OpenTelemetry Collector (skipped without one, see package oteltest).
func TestAlertsArriveAsLogRecords(t *testing.T) {
	oc := oteltest.StartCollector(t)
	for _, proto := range []string{"grpc", "http"} {
		t.Run(proto, func(t *testing.T) {
			ep := oc.GRPC
			if proto == "http" {
				ep = oc.HTTP
			}
			tel, _ := startTelemetry(t, otelexport.Config{Endpoint: ep, Protocol: proto, Insecure: true, Headers: map[string]string{"x-test": "1"}}, nil)
			at := time.Date(2026, 11, 22, 6, 0, 0, 0, time.UTC)
			NewAlertLog(tel.o.Exporter, tel.o.Clock).EmitAlert(context.Background(), Alert{Kind: "budget", Severity: "warn", Scope: "team-" + proto,
				Message: "budget team-" + proto + " is 90% used", Attributes: map[string]string{"use_ratio": "0.9"}, Time: at})
			if err := tel.Flush(context.Background()); err != nil {
				t.Fatal(err)
			}
			oteltest.Eventually(t, 30*time.Second, "the alert at the OTel Collector", func() bool {
				for _, r := range oc.Logs(t) {
					if r.Attrs[AttrAlertScope] != "team-"+proto {
						continue
					}
					if r.EventName != EventAlert || r.Body != "budget team-"+proto+" is 90% used" || r.SeverityText != "WARN" ||
						r.Severity != "SEVERITY_NUMBER_WARN" || r.Attrs[AttrAlertKind] != "budget" || r.Attrs["trainmeter.alert.use_ratio"] != "0.9" ||
						!r.Time.Equal(at) || r.Resource["service.name"] != "trainmeter-collector" {
						t.Fatalf("alert record arrived as %+v", r)
					}
					return true
				}
				return false
			})
		})
	}
}

// TLS: the receiver's certificate is verified with --otlp-ca, over gRPC and
// HTTP, against a real OpenTelemetry Collector serving TLS.
func TestAlertsOverTLSWithCAFile(t *testing.T) {
	files, err := tlstest.Write(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	oc := oteltest.StartCollectorWith(t, oteltest.CollectorOptions{TLSCert: files.ServerCert, TLSKey: files.ServerKey})
	for _, proto := range []string{"grpc", "http"} {
		t.Run(proto, func(t *testing.T) {
			ep := oc.GRPC
			if proto == "http" {
				ep = oc.HTTP
			}
			tel, _ := startTelemetry(t, otelexport.Config{Endpoint: ep, Protocol: proto, CAFile: files.CAFile}, nil)
			NewAlertLog(tel.o.Exporter, tel.o.Clock).EmitAlert(context.Background(), Alert{Kind: "price", Severity: "error", Scope: "tls-" + proto, Message: "price spike"})
			if err := tel.Flush(context.Background()); err != nil {
				t.Fatal(err)
			}
			oteltest.Eventually(t, 30*time.Second, "the alert over TLS", func() bool {
				for _, r := range oc.Logs(t) {
					if r.Attrs[AttrAlertScope] == "tls-"+proto {
						return r.SeverityText == "ERROR" && r.Body == "price spike"
					}
				}
				return false
			})
		})
	}
}

// Headers go with every OTLP/HTTP request (checked on a plain HTTP server
// that records them: the test collector has no auth extension to check them).
func TestHeadersAreSent(t *testing.T) {
	got := make(chan http.Header, 16)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		select {
		case got <- r.Header.Clone():
		default:
		}
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(srv.Close) // after the telemetry's shutdown (cleanups run last-in first-out)
	tel, _ := startTelemetry(t, otelexport.Config{Endpoint: strings.TrimPrefix(srv.URL, "http://"), Protocol: "http", Insecure: true,
		Headers: map[string]string{"Authorization": "Bearer s3cret", "X-Tenant": "ml"}}, nil)
	NewAlertLog(tel.o.Exporter, tel.o.Clock).EmitAlert(context.Background(), Alert{Kind: "budget", Message: "m"})
	if err := tel.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	select {
	case h := <-got:
		if h.Get("Authorization") != "Bearer s3cret" || h.Get("X-Tenant") != "ml" {
			t.Fatalf("request headers %v", h)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no OTLP request arrived")
	}
}
