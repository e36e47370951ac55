package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/trainmeter/trainmeter/internal/testkit"
)

// carbonAcrossNextSwitch writes a carbon file for zone DE (UTC): 400
// gCO2/kWh, 100 from the next minute boundary at least lead ahead for 30
// minutes, and 50 in the hour 12 hours from then (the cleanest hour of the
// day, for the optimizer). It returns the file, the switch and that hour.
func carbonAcrossNextSwitch(t *testing.T, lead time.Duration) (string, time.Time, int) {
	t.Helper()
	sw := time.Now().UTC().Add(lead).Truncate(time.Minute).Add(time.Minute)
	clean := (sw.Hour() + 12) % 24
	y := fmt.Sprintf("zones:\n  DE:\n    timezone: UTC\n    default: 400\n    rules:\n"+
		"      - {days: [all], from: %q, to: %q, gco2_kwh: 100}\n"+
		"      - {days: [all], from: \"%02d:00\", to: \"%02d:00\", gco2_kwh: 50}\n",
		sw.Format("15:04"), sw.Add(30*time.Minute).Format("15:04"), clean, (clean+1)%24)
	path := filepath.Join(t.TempDir(), "carbon.yaml")
	if err := os.WriteFile(path, []byte(y), 0o644); err != nil {
		t.Fatal(err)
	}
	return path, sw, clean
}

// TestCO2ByTheHourAcrossTheSwitch: a replayed node in zone DE runs across the
// carbon file's switch from 400 to 100 gCO2/kWh: co2_kg is the energy before
// the switch at 400 and after it at 100 (not all at the flat
// --grid-gco2-kwh, which covers nothing here), in the CSV, report --json
// and the report's split. A second, shorter run of the same model makes it
// a repeated run: `trainmeter recommend` says to run it at the file's
// cleanest hour, with the share saved.
func TestCO2ByTheHourAcrossTheSwitch(t *testing.T) {
	t.Parallel()
	file, sw, clean := carbonAcrossNextSwitch(t, 5*time.Second)
	c := startCollector(t, "--carbon-file", file, "--carbon-node-zone", "replay-node=DE", "--grid-gco2-kwh", "999")
	sock := c.startAgent("replay-node", "replay:"+writeTrace(t, costGPUs, costPowerW, costPowerW, 150), "--warmup", "30s")
	const every = 100 * time.Millisecond
	steps := int(time.Until(sw.Add(5*time.Second))/every) + 1
	row := runCosted(t, c, sock, "carbon", "", steps, every)

	start, end := runTimes(t, row)
	if !start.Before(sw) || !end.After(sw) {
		t.Fatalf("run %v..%v does not span the switch at %v", start, end, sw)
	}
	beforeJ := costGPUs * costPowerW * sw.Sub(start).Seconds()
	afterJ := costGPUs * costPowerW * end.Sub(sw).Seconds()
	wantKg := (beforeJ*400 + afterJ*100) / 3.6e9
	t.Logf("%.1f J at 400 g, %.1f J at 100 g: expect %.6g kg (all at 400 it would be %.6g)", beforeJ, afterJ, wantKg, (beforeJ+afterJ)*400/3.6e9)
	within(t, "co2_kg", num(t, row, "co2_kg"), wantKg, costTol)
	within(t, "co2_gco2_per_kwh", num(t, row, "co2_gco2_per_kwh"), (beforeJ*400+afterJ*100)/(beforeJ+afterJ), costTol)
	if row["co2_source"] != "file" || row["carbon_zone"] != "DE" {
		t.Errorf("co2_source %q carbon_zone %q, want file and DE", row["co2_source"], row["carbon_zone"])
	}

	var rep struct {
		Co2Kg    float64 `json:"co2_kg"`
		Co2Bands []struct {
			Zone       string  `json:"zone"`
			Source     string  `json:"source"`
			KWh        float64 `json:"kwh"`
			Gco2PerKwh float64 `json:"gco2_per_kwh"`
			Co2Kg      float64 `json:"co2_kg"`
		} `json:"co2_bands"`
	}
	if err := json.Unmarshal([]byte(c.cli("report", "carbon", "--json")), &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Co2Bands) != 2 || rep.Co2Bands[0].Gco2PerKwh != 100 || rep.Co2Bands[1].Gco2PerKwh != 400 || rep.Co2Bands[0].Zone != "DE" {
		t.Fatalf("co2 bands %+v", rep.Co2Bands)
	}
	within(t, "kWh at 100 g", rep.Co2Bands[0].KWh, afterJ/3.6e6, costTol)
	within(t, "kWh at 400 g", rep.Co2Bands[1].KWh, beforeJ/3.6e6, costTol)
	closeTo(t, "bands add up", rep.Co2Bands[0].Co2Kg+rep.Co2Bands[1].Co2Kg, rep.Co2Kg, 1e-12)
	human := c.cli("report", "carbon")
	for _, want := range []string{"gCO2/kWh energy-weighted, zone DE", "DE 100 g/kWh", "DE 400 g/kWh", "(carbon file)"} {
		if !strings.Contains(human, want) {
			t.Errorf("report lacks %q:\n%s", want, human)
		}
	}

	// The second run: all at 100 g; at the cleanest hour it would be at 50.
	runCosted(t, c, sock, "carbon-2", "", 10, every)
	out := c.cli("recommend")
	title := fmt.Sprintf("[schedule] Run costed at %02d:00–%02d:00 (DE, UTC time): 50%% less CO2 per run", clean, (clean+1)%24)
	if !strings.Contains(out, title) || !strings.Contains(out, "kg CO2") {
		t.Errorf("recommend lacks %q with its CO2 saved:\n%s", title, out)
	}
}

// TestCO2FromTheLiveSource: serve --carbon-api against a fake with
// ElectricityMaps' documented shape (its token from --carbon-api-token-file):
// the collector fetches zone DE at start (GET /status says so), and a run on
// a node in DE gets the live intensity, 250 gCO2/kWh, instead of the flat
// fallback.
func TestCO2FromTheLiveSource(t *testing.T) {
	t.Parallel()
	var badToken atomic.Int64
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("auth-token") != "em-token" {
			badToken.Add(1)
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		now := time.Now().UTC().Truncate(time.Hour)
		entry := func(h time.Time) string {
			return fmt.Sprintf(`{"zone":"DE","carbonIntensity":250,"datetime":%q,"updatedAt":%q,"emissionFactorType":"lifecycle","isEstimated":true}`,
				h.Format("2006-01-02T15:04:05.000Z"), now.Format(time.RFC3339))
		}
		switch r.URL.Path {
		case "/v3/carbon-intensity/history":
			fmt.Fprintf(w, `{"zone":"DE","history":[%s,%s]}`, entry(now.Add(-2*time.Hour)), entry(now.Add(-time.Hour)))
		case "/v3/carbon-intensity/latest":
			fmt.Fprint(w, entry(now)) // the next hour, not yet published, carries this one
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(api.Close)
	status := testkit.FreeAddr(t)
	tokenFile := filepath.Join(t.TempDir(), "carbon-token")
	if err := os.WriteFile(tokenFile, []byte("em-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c := startCollector(t, "--carbon-api", api.URL, "--carbon-api-token-file", tokenFile, "--carbon-zone", "DE", "--grid-gco2-kwh", "999", "--status-listen", status)
	testkit.Eventually(t, "the collector's first carbon fetch", func() bool {
		carbon, _ := statusOf(t, status)["carbon"].(map[string]any)
		zones, _ := carbon["zones"].(map[string]any)
		de, _ := zones["DE"].(map[string]any)
		return de["hours"] == 3.0
	})
	if n := badToken.Load(); n != 0 {
		t.Fatalf("%d requests without the token", n)
	}
	sock := c.startAgent("replay-node", "replay:"+writeTrace(t, costGPUs, costPowerW, costPowerW, 60), "--warmup", "30s")
	row := runCosted(t, c, sock, "live", "", 20, 100*time.Millisecond)
	if row["co2_source"] != "live" || row["carbon_zone"] != "DE" || row["co2_gco2_per_kwh"] != "250" {
		t.Errorf("co2_source %q carbon_zone %q co2_gco2_per_kwh %q, want live, DE, 250", row["co2_source"], row["carbon_zone"], row["co2_gco2_per_kwh"])
	}
	var rep struct {
		Co2Kg     float64 `json:"co2_kg"`
		EnergyKwh float64 `json:"energy_kwh"`
	}
	if err := json.Unmarshal([]byte(c.cli("report", "live", "--json")), &rep); err != nil {
		t.Fatal(err)
	}
	within(t, "co2_kg (report --json: the CSV rounds to 6 decimals)", rep.Co2Kg, rep.EnergyKwh*0.25, 1e-12)
}
