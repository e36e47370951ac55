package e2e

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/trainmeter/trainmeter/internal/pgtest"
)

// TestCollectorOnPostgreSQL: a collector serving on PostgreSQL takes an
// agent's run (sim GPU) and answers `report --json`; a second collector on
// the same database, which took none of it, answers the same report.
func TestCollectorOnPostgreSQL(t *testing.T) {
	t.Parallel()
	url := pgtest.ServerDB(t)
	c := startCollector(t, "--store", url, "--raw-retention", "720h")
	tr := dialTrainer(t, c.startAgent("pg-node", "sim:1"))
	tr.send(`{"event":"run_start","run_id":"pg-run","model":"m","warmup_s":0}`)
	tr.runSteps("pg-run", 20, 1000, 20*time.Millisecond)
	tr.send(`{"event":"run_end","run_id":"pg-run"}`)
	tr.sync()
	report := c.endedReports("pg-run")["pg-run"]
	if report["tokens_processed"] != "20000" && report["tokens_processed"] != 20000.0 {
		t.Errorf("tokens_processed %v, want 20000 (report: %v)", report["tokens_processed"], report)
	}
	if e, _ := report["energy_j"].(float64); e <= 0 {
		t.Errorf("energy_j %v, want the sim GPU's energy (report: %v)", report["energy_j"], report)
	}
	other := startCollector(t, "--store", url)
	var got map[string]any
	if err := json.Unmarshal([]byte(other.cli("report", "pg-run", "--json")), &got); err != nil {
		t.Fatal(err)
	}
	a, _ := json.Marshal(report)
	b, _ := json.Marshal(got)
	if string(a) != string(b) {
		t.Errorf("the second collector's report differs:\n%s\nwant\n%s", b, a)
	}
}
