package server_test

import (
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/trainmeter/trainmeter/collector/internal/pricing/carbonwatch"
	"github.com/trainmeter/trainmeter/collector/internal/server"
	tu "github.com/trainmeter/trainmeter/collector/internal/testutil"
	"github.com/trainmeter/trainmeter/internal/pgtest"
	"github.com/trainmeter/trainmeter/internal/testkit"
	"github.com/trainmeter/trainmeter/pkg/clock"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// fakeElectricityMaps answers /v3/carbon-intensity/history and /latest for
// zone DE in ElectricityMaps' documented shape: 400 gCO2/kWh in the hour
// before tu.T0 (12:00 UTC), 100 in the hour from it. It refuses requests
// without the token. It counts the requests and those without the token.
func fakeElectricityMaps(t *testing.T, token string) (*httptest.Server, *atomic.Int64, *atomic.Int64) {
	t.Helper()
	var unauthorized, calls atomic.Int64
	entry := func(hour string, g int) string {
		return fmt.Sprintf(`{"zone":"DE","carbonIntensity":%d,"datetime":"2025-03-01T%s:00:00.000Z","updatedAt":"2025-03-01T12:05:00.000Z","createdAt":"2025-02-26T12:00:00.000Z","emissionFactorType":"lifecycle","isEstimated":false,"estimationMethod":null}`, g, hour)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		if r.Header.Get("auth-token") != token {
			unauthorized.Add(1)
			http.Error(w, `{"error":"unauthorized"}`, http.StatusUnauthorized)
			return
		}
		if r.URL.Query().Get("zone") != "DE" {
			http.Error(w, `{"error":"zone not found"}`, http.StatusNotFound)
			return
		}
		switch r.URL.Path {
		case "/v3/carbon-intensity/history":
			fmt.Fprintf(w, `{"zone":"DE","history":[%s,%s]}`, entry("10", 700), entry("11", 400))
		case "/v3/carbon-intensity/latest":
			fmt.Fprint(w, entry("12", 100))
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	return srv, &unauthorized, &calls
}

// TestCO2AcrossTwoCarbonHours: a run from 11:59:58 to 12:00:02 on a node in
// zone DE draws 2000 J in the 11:00 hour (400 gCO2/kWh) and 4000 J in the
// 12:00 hour (100 gCO2/kWh), one window straddling the hour: its co2_kg is
// the energy of each hour at that hour's intensity, not all of it at the
// flat factor, and the report splits it.
func TestCO2AcrossTwoCarbonHours(t *testing.T) {
	api, unauthorized, _ := fakeElectricityMaps(t, "s3cret")
	srv := start(t, server.Config{
		GridGCO2PerKWh: 300, // the fallback: must not be used here
		Carbon: server.CarbonConfig{
			API:  carbonwatch.Config{BaseURL: api.URL, Token: "s3cret"},
			Zone: "DE",
		},
		Clock: clock.NewFake(tu.Now()),
	})
	testkit.Eventually(t, "the carbon source's first fetch", func() bool {
		c := srv.Status().Carbon
		return c != nil && c.Zones["DE"].Hours == 3
	})
	if n := unauthorized.Load(); n != 0 {
		t.Fatalf("%d requests without the auth-token header", n)
	}
	checkCO2AcrossTwoCarbonHours(t, srv)
}

// TestCarbonFetchedOnceForTheFleet: two collectors over one PostgreSQL
// database. Only the leader asks the API; the follower reads the hours
// the leader stored within CatalogReload and books a run's CO2 at them
// (the assertions of TestCO2AcrossTwoCarbonHours, on the follower).
func TestCarbonFetchedOnceForTheFleet(t *testing.T) {
	api, _, calls := fakeElectricityMaps(t, "s3cret")
	clk := clock.NewFake(tu.Now())
	cfg := server.Config{StoreURL: pgtest.ServerDB(t), Clock: clk, GridGCO2PerKWh: 300,
		Carbon: server.CarbonConfig{API: carbonwatch.Config{BaseURL: api.URL, Token: "s3cret"}, Zone: "DE"}}
	a := start(t, cfg)
	b := start(t, cfg)
	if !a.Status().Leader || b.Status().Leader {
		t.Fatalf("leaders: a %v, b %v; want a only", a.Status().Leader, b.Status().Leader)
	}
	testkit.Eventually(t, "the follower reloads the leader's fetch", func() bool {
		clk.Advance(time.Second)
		return b.Status().Carbon.Zones["DE"].Hours == 3
	})
	if n, f := calls.Load(), b.Status().Carbon.Fetches; n != 2 || f != 0 || a.Status().Carbon.Fetches != 1 {
		t.Fatalf("%d API requests, follower fetches %d, leader %d: want 2 (history and latest, of the leader alone), 0, 1", n, f, a.Status().Carbon.Fetches)
	}
	checkCO2AcrossTwoCarbonHours(t, b)
}

func checkCO2AcrossTwoCarbonHours(t *testing.T, srv *server.Server) {
	t.Helper()
	conn := tu.Dial(t, srv.Addr().String())
	q := trainmeterv1.NewQueryServiceClient(conn)
	n := tu.Connect(t, conn, "node-1", "boot-a")

	w1 := tu.Window("co2", -2, 100, 1000) // [11:59:58, 11:59:59)
	w2 := tu.Window("co2", -0.5, 100, 2000)
	w2.End = tu.TS(0.5)                  // [11:59:59.5, 12:00:00.5): half in each hour
	w3 := tu.Window("co2", 1, 100, 3000) // [12:00:01, 12:00:02)
	n.MustAck(tu.Batch(1, -2, []*trainmeterv1.RunWindow{w1, w2, w3}, tu.Start("co2", -2, "m"), tu.End("co2", 2)))

	r := getRun(t, q, "co2")
	want := (2000*400 + 4000*100) / 3.6e6 / 1000 // kg: J → kWh × g/kWh → g → kg
	if r.Co2Kg == nil || math.Abs(r.GetCo2Kg()-want) > 1e-15 {
		t.Fatalf("co2_kg = %v (set %v), want %v (all at the flat 300 g it would be %v)", r.GetCo2Kg(), r.Co2Kg != nil, want, 6000/3.6e6*0.3)
	}
	if r.GetCo2Source() != "live" || r.GetCarbonZone() != "DE" {
		t.Errorf("co2_source %q carbon_zone %q, want live and DE", r.GetCo2Source(), r.GetCarbonZone())
	}
	if g := r.GetCo2Gco2PerKwh(); math.Abs(g-200) > 1e-9 { // (2000×400 + 4000×100) / 6000
		t.Errorf("co2_gco2_per_kwh = %v, want 200", g)
	}
	bands := r.GetCo2Bands()
	if len(bands) != 2 {
		t.Fatalf("co2 bands %v, want the 100 and the 400 g/kWh hour", bands)
	}
	for i, wb := range []struct {
		g, j float64
	}{{100, 4000}, {400, 2000}} {
		b := bands[i]
		if b.GetZone() != "DE" || b.GetSource() != "live" || b.GetGco2PerKwh() != wb.g ||
			math.Abs(b.GetKwh()-wb.j/3.6e6) > 1e-15 || math.Abs(b.GetCo2Kg()-wb.j/3.6e6*wb.g/1000) > 1e-15 {
			t.Errorf("band %d = %v, want DE live %v g/kWh, %v J", i, b, wb.g, wb.j)
		}
	}
}
