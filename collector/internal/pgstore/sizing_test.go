package pgstore_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/trainmeter/trainmeter/collector/internal/loadgen"
	"github.com/trainmeter/trainmeter/collector/internal/storage"
	tu "github.com/trainmeter/trainmeter/collector/internal/testutil"
	"github.com/trainmeter/trainmeter/internal/pgtest"
)

// TestLayoutSizes loads loadgen's batches (8 GPUs, one run, a batch a
// second) from several nodes, rolled up every 10 s of data as the leader
// rolls up (rollbehind.go), and checks the rows each table gets: one raw
// row per batch, one rollup row per node (and per run and node) a minute.
// It logs rows and bytes per node-day per table after a VACUUM (what
// autovacuum keeps; rollups and runs hold the space of their updated
// rows' old versions), and the bytes of the live rows alone: docs/deploy.md's sizing. TRAINMETER_SIZING_SECONDS
// sets the seconds per node (default 180).
func TestLayoutSizes(t *testing.T) {
	const nodes, gpus = 4, 8
	seconds := 180
	if v, err := strconv.Atoi(os.Getenv("TRAINMETER_SIZING_SECONDS")); err == nil && v > 0 {
		seconds = v
	}
	url := pgtest.DB(t)
	st := open(t, url)
	t0 := tu.T0.Truncate(time.Minute)
	var wg sync.WaitGroup
	errs := make(chan error, nodes)
	for n := range nodes {
		wg.Go(func() {
			node, run := fmt.Sprint("node-", n), fmt.Sprint("run-", n)
			for s := range seconds {
				b := loadgen.MakeBatch(uint64(s+1), t0.Add(time.Duration(s+1)*time.Second), time.Second, run, gpus, s == 0)
				if _, err := st.ApplyBatchResult(storage.Sender{Node: node, Boot: "boot"}, b); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	ctx := context.Background()
	for s := 10; s <= seconds+10; s += 10 {
		if err := st.RollUp(ctx, t0.Add(time.Duration(s)*time.Second), true); err != nil {
			t.Fatal(err)
		}
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "VACUUM ANALYZE"); err != nil {
		t.Fatal(err)
	}
	batches := nodes * seconds
	minutes := nodes * seconds / 60
	want := map[string]int{"applied_batches": batches, "run_windows": batches, "run_events": nodes, "node_windows": batches,
		"node_rollups": minutes, "run_rollups": minutes, "runs": nodes}
	scale := float64(86400) / float64(seconds) / nodes // to one node-day
	for _, table := range []string{"applied_batches", "run_windows", "run_events", "node_windows", "node_rollups", "run_rollups", "runs", "nodes"} {
		var rows int
		var bytes, live int64
		// pg_total_relation_size of a partitioned table's partitions:
		// their heap, TOAST and indexes.
		if err := conn.QueryRow(ctx, `SELECT (SELECT count(*) FROM `+table+`), (SELECT coalesce(sum(pg_column_size(x.*)), 0) FROM `+table+` x),
			coalesce((SELECT sum(pg_total_relation_size(c.oid)) FROM pg_class c WHERE c.oid = $1::regclass
				OR c.oid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = $1::regclass)), 0)`, table).Scan(&rows, &live, &bytes); err != nil {
			t.Fatal(err)
		}
		if w, ok := want[table]; ok && rows != w {
			t.Errorf("%s: %d rows, want %d", table, rows, w)
		}
		if table == "runs" || table == "nodes" {
			t.Logf("%-16s %7d rows %10d B, %d B in live rows (kept, not per day)", table, rows, bytes, live)
			continue
		}
		t.Logf("%-16s %7d rows %10d B  per node-day: %9.0f rows %8.1f MiB (%.1f MiB in live rows, no index)", table, rows, bytes,
			float64(rows)*scale, float64(bytes)*scale/(1<<20), float64(live)*scale/(1<<20))
	}
}
