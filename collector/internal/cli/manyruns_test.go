package cli

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/trainmeter/trainmeter/collector/internal/server"
	"github.com/trainmeter/trainmeter/collector/internal/store"
	tu "github.com/trainmeter/trainmeter/collector/internal/testutil"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// manyRunsCollector is a real collector (gRPC on loopback, BadgerDB in a
// temp dir) whose store holds n ended runs, written to the store before it
// serves (ingesting them through the stream would take minutes): nodes of
// 100 runs each, run-000000 ... in run id order, started a second apart.
func manyRunsCollector(t *testing.T, n int) string {
	t.Helper()
	dir := t.TempDir()
	st, err := store.Open(dir, store.Options{Clock: tu.Clock()})
	if err != nil {
		t.Fatal(err)
	}
	const perBatch = 100
	for first := 0; first < n; first += perBatch {
		var windows []*trainmeterv1.RunWindow
		var events []*trainmeterv1.RunEvent
		for i := first; i < min(n, first+perBatch); i++ {
			id := fmt.Sprintf("run-%06d", i)
			sec := float64(i - first)
			windows = append(windows, tu.Window(id, sec, 100, 50))
			events = append(events, tu.Start(id, sec, fmt.Sprintf("model-%d", i%50)), tu.End(id, sec+1))
		}
		b := tu.Batch(1, 0, windows, events...)
		b.WindowEnd = tu.TS(perBatch + 1)
		if _, err := st.ApplyBatch(fmt.Sprintf("node-%04d", first/perBatch), "boot", b); err != nil {
			t.Fatalf("seeding runs %d..: %v", first, err)
		}
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	srv := server.New(server.Config{Listen: "127.0.0.1:0", DataDir: dir, GPUPricePerHour: 2, Clock: tu.Clock()},
		slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err := srv.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	})
	return srv.Addr().String()
}

// TestRunsManyRuns: with 100,000 runs a single ListRuns answer (37 MB) is
// past a gRPC client's 4 MiB limit; runs, runs --model and summary page
// through ListRuns and see every run. Under -race (or -short) 15,000 runs,
// still 5.5 MB in one answer. What a listing holds is checked here, not how
// fast it comes (docs/benchmarks.md, the run listing): a deadline far
// past the default 10 s keeps a loaded machine from failing it.
func TestRunsManyRuns(t *testing.T) {
	n := 100_000
	if raceEnabled || testing.Short() {
		n = 15_000
	}
	start := time.Now()
	env := map[string]string{EnvCollector: manyRunsCollector(t, n)}
	t.Logf("seeded %d runs in %v", n, time.Since(start))

	start = time.Now()
	out, err := run(t, env, "runs", "--timeout", "5m")
	if err != nil {
		t.Fatalf("runs: %v", err)
	}
	t.Logf("runs: %d bytes, in %v", len(out), time.Since(start))
	seen := make(map[string]bool, n)
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) > 0 && strings.HasPrefix(f[0], "run-") {
			if seen[f[0]] {
				t.Fatalf("runs lists %s twice", f[0])
			}
			seen[f[0]] = true
		}
	}
	if len(seen) != n {
		t.Fatalf("runs lists %d runs, want %d", len(seen), n)
	}
	out, err = run(t, env, "runs", "--json", "--model", "model-3", "--timeout", "5m")
	if err != nil {
		t.Fatalf("runs --model: %v", err)
	}
	if got, want := len(runIDsOf(t, out)), n/50; got != want {
		t.Errorf("runs --model model-3: %d runs, want %d", got, want)
	}
	out, err = run(t, env, "summary", "--json", "--timeout", "5m")
	if err != nil {
		t.Fatalf("summary: %v", err)
	}
	if !strings.Contains(out, fmt.Sprintf(`"runs": %d,`, n)) {
		t.Errorf("summary --json does not count %d runs:\n%.500s", n, out)
	}
}
