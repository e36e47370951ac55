package otelexport

import (
	"net/http"
	"slices"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// PrometheusGate keeps some series of /metrics from scrapes it does not
// authorize: a series carrying any of PrivateAttributes is served only when
// Authorized passes the request; every other series is served to all.
type PrometheusGate struct {
	// PrivateAttributes are OTel attribute keys ("trainmeter.run.id"),
	// matched as written and as Prometheus names them (dots and other
	// characters outside [A-Za-z0-9_] become "_").
	PrivateAttributes []string
	// Authorized reports whether the scrape may see the private series.
	Authorized func(r *http.Request) bool
}

// handler serves full to authorized scrapes and a copy of reg without the
// private series to the rest.
func (g *PrometheusGate) handler(reg prometheus.Gatherer, serve func(prometheus.Gatherer) http.Handler) http.Handler {
	private := map[string]bool{}
	for _, a := range g.PrivateAttributes {
		private[a], private[promName(a)] = true, true
	}
	full := serve(reg)
	public := serve(prometheus.GathererFunc(func() ([]*dto.MetricFamily, error) {
		mfs, err := reg.Gather()
		out := mfs[:0]
		for _, mf := range mfs {
			if mf.Metric = slices.DeleteFunc(mf.Metric, func(m *dto.Metric) bool {
				return slices.ContainsFunc(m.GetLabel(), func(l *dto.LabelPair) bool { return private[l.GetName()] })
			}); len(mf.Metric) > 0 {
				out = append(out, mf)
			}
		}
		return out, err
	}))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if g.Authorized != nil && g.Authorized(r) {
			full.ServeHTTP(w, r)
			return
		}
		public.ServeHTTP(w, r)
	})
}

// promName is an attribute key as a Prometheus label name.
func promName(s string) string {
	return strings.Map(func(r rune) rune {
		if r == '_' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
			return r
		}
		return '_'
	}, s)
}
