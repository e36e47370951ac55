package e2e

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/trainmeter/trainmeter/internal/pgtest"
	"github.com/trainmeter/trainmeter/internal/testkit"
)

// TestMigrateToPostgreSQL: `trainmeter migrate` refuses the data directory
// of a collector still running on it; once it is stopped, moves it into
// an empty PostgreSQL database, and a collector serving on that database
// answers every run's `report --json` and `runs --json` as the BadgerDB
// collector did. A second migrate into the database is refused.
func TestMigrateToPostgreSQL(t *testing.T) {
	t.Parallel()
	url := pgtest.ServerDB(t)
	data := filepath.Join(t.TempDir(), "data")
	c, collector := collectorAt(t, testkit.FreeAddr(t), data)
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

	migrate := func() (string, error) {
		out, err := exec.Command(filepath.Join(binDir, "trainmeter"), "migrate", "--from", data, "--to", url).CombinedOutput()
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

	pg := startCollector(t, "--store", url)
	if got := pg.cli("runs", "--json"); got != want["runs"] {
		t.Errorf("runs --json on PostgreSQL:\n%s\nwant (BadgerDB)\n%s", got, want["runs"])
	}
	for _, run := range []string{"mig-a", "mig-b"} {
		if got := pg.cli("report", run, "--json"); got != want[run] {
			t.Errorf("report %s --json on PostgreSQL:\n%s\nwant (BadgerDB)\n%s", run, got, want[run])
		}
	}
	if out, err := migrate(); err == nil || !strings.Contains(out, "the database is not empty") {
		t.Errorf("a second migrate: %v\n%s", err, out)
	}
}
