package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/trainmeter/trainmeter/internal/pgtest"
	"github.com/trainmeter/trainmeter/internal/testkit"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// TestMigrateToPostgreSQL: `trainmeter migrate` refuses the data directory
// of a collector still running on it; once it is stopped, moves it into
// an empty PostgreSQL database, and a collector serving on that database
// answers every run's `report --json` and `runs --json` as the BadgerDB
// collector did, and run_report's cost and CO2 are report --json's
// (migrate --config: the collector's pricing). A second migrate into the database
// is refused.
func TestMigrateToPostgreSQL(t *testing.T) {
	t.Parallel()
	url := pgtest.ServerDB(t)
	data := filepath.Join(t.TempDir(), "data")
	c, collector := collectorAt(t, testkit.FreeAddr(t), data, "--gpu-price-per-hour", "2.5", "--grid-gco2-kwh", "400")
	tr := dialTrainer(t, c.startAgent("mig-node", "sim:2"))
	for _, run := range []string{"mig-a", "mig-b"} {
		tr.send(`{"event":"run_start","run_id":%q,"model":"m","warmup_s":0}`, run)
		tr.runSteps(run, 10, 1000, 20*time.Millisecond)
		tr.send(`{"event":"run_end","run_id":%q}`, run)
	}
	tr.sync()
	c.endedReports("mig-a", "mig-b")
	want := map[string]string{"runs": c.cli("runs", "--json")}
	for _, run := range []string{"mig-a", "mig-b"} {
		want[run] = c.cli("report", run, "--json")
	}

	// The collector's configuration: its pricing prices the runs' report
	// columns the SQL views read.
	config := filepath.Join(t.TempDir(), "collector.yaml")
	if err := os.WriteFile(config, []byte("pricing:\n  gpu_price_per_hour: 2.5\ncarbon:\n  grid_gco2_kwh: 400\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	migrate := func() (string, error) {
		out, err := exec.Command(filepath.Join(binDir, "trainmeter"), "migrate", "--from", data, "--to", url, "--config", config).CombinedOutput()
		return string(out), err
	}
	if out, err := migrate(); err == nil || !strings.Contains(out, "is in use: a collector (trainmeter serve) is running on it") {
		t.Errorf("migrate from a running collector's directory: %v\n%s", err, out)
	}
	stopDaemon(c, collector)
	out, err := migrate()
	if err != nil || !strings.Contains(out, "moved "+data) || !strings.Contains(out, ": 2 runs,") {
		t.Fatalf("migrate: %v\n%s", err, out)
	}
	t.Logf("%s", out)

	pg := startCollector(t, "--store", url, "--gpu-price-per-hour", "2.5", "--grid-gco2-kwh", "400")
	if got := pg.cli("runs", "--json"); got != want["runs"] {
		t.Errorf("runs --json on PostgreSQL:\n%s\nwant (BadgerDB)\n%s", got, want["runs"])
	}
	for _, run := range []string{"mig-a", "mig-b"} {
		if got := pg.cli("report", run, "--json"); got != want[run] {
			t.Errorf("report %s --json on PostgreSQL:\n%s\nwant (BadgerDB)\n%s", run, got, want[run])
		}
	}
	db, err := pgx.Connect(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close(t.Context())
	for _, run := range []string{"mig-a", "mig-b"} {
		r, err := pg.q.GetRun(t.Context(), &trainmeterv1.GetRunRequest{RunId: run})
		if err != nil {
			t.Fatal(err)
		}
		var cost, co2 *float64
		err = db.QueryRow(t.Context(), `SELECT cost_usd, co2_kg FROM run_report WHERE run_id = $1`, run).Scan(&cost, &co2)
		if want := r.GetRun(); err != nil || cost == nil || want.CostUsd == nil || *cost != want.GetCostUsd() || co2 == nil || want.Co2Kg == nil || *co2 != want.GetCo2Kg() {
			t.Errorf("run_report %s: cost_usd %v, co2_kg %v (%v); report --json %v, %v", run, val(cost), val(co2), err, val(want.CostUsd), val(want.Co2Kg))
		}
	}
	if out, err := migrate(); err == nil || !strings.Contains(out, "the database is not empty") {
		t.Errorf("a second migrate: %v\n%s", err, out)
	}
}

// val is *p, or nil.
func val(p *float64) any {
	if p == nil {
		return nil
	}
	return *p
}
