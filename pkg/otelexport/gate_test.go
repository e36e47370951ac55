package otelexport

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// TestPrometheusGate: a series with a private attribute is on /metrics only
// for scrapes the gate authorizes; a family left with no series is gone;
// series without one are served to all; metrics mixing both keep the open
// series.
func TestPrometheusGate(t *testing.T) {
	gate := &PrometheusGate{
		PrivateAttributes: []string{"tenant.scope"},
		Authorized:        func(r *http.Request) bool { return r.Header.Get("Authorization") == "Bearer ok" },
	}
	e, err := Start(context.Background(), Config{PrometheusListen: "127.0.0.1:0", PrometheusGate: gate}, testResource, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Shutdown(context.Background())
	m := e.Meter()
	secret, _ := m.Int64Counter("gate.secret")
	secret.Add(context.Background(), 1, metric.WithAttributes(attribute.String("tenant.scope", "team-a")))
	mixed, _ := m.Int64Counter("gate.mixed")
	mixed.Add(context.Background(), 1, metric.WithAttributes(attribute.String("tenant.scope", "team-b")))
	mixed.Add(context.Background(), 1, metric.WithAttributes(attribute.String("node", "n1")))
	open, _ := m.Int64Counter("gate.open")
	open.Add(context.Background(), 1)
	scrape := func(auth string) string {
		req, _ := http.NewRequest(http.MethodGet, "http://"+e.PrometheusAddr().String()+"/metrics", nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	for auth, want := range map[string]map[string]bool{
		"":            {"gate_secret_total": false, `tenant_scope="team-a"`: false, `tenant_scope="team-b"`: false, `gate_mixed_total{node="n1"`: true, "gate_open_total": true},
		"Bearer nope": {"gate_secret_total": false, `tenant_scope="team-b"`: false, "gate_open_total": true},
		"Bearer ok":   {"gate_secret_total": true, `tenant_scope="team-a"`: true, `tenant_scope="team-b"`: true, `gate_mixed_total{node="n1"`: true, "gate_open_total": true},
	} {
		text := scrape(auth)
		for s, w := range want {
			if strings.Contains(text, s) != w {
				t.Errorf("scrape with %q: %s present = %v, want %v\n%s", auth, s, !w, w, text)
			}
		}
	}
}
