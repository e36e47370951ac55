package telemetry

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/trainmeter/trainmeter/collector/internal/ingest"
	"github.com/trainmeter/trainmeter/collector/internal/pgstore"
	"github.com/trainmeter/trainmeter/collector/internal/storage"
	"github.com/trainmeter/trainmeter/internal/pgtest"
	"github.com/trainmeter/trainmeter/pkg/clock"
	"github.com/trainmeter/trainmeter/pkg/otelexport"
)

// TestFleetRunSeriesFromTheLeader: two collectors on one PostgreSQL, each
// applying one run's batches. Only the leader exports run series, and it
// exports both runs, one series each, whichever collector applied them;
// when leadership moves, so do the series; past RunWindow without data a
// run drops out.
func TestFleetRunSeriesFromTheLeader(t *testing.T) {
	url := pgtest.ServerDB(t)
	clk := clock.NewFake(time.Now().Truncate(time.Second))
	var leader atomic.Int32 // which collector leads
	type replica struct {
		st  *pgstore.Store
		tel *Telemetry
	}
	start := func(i int32) replica {
		st, err := pgstore.Open(context.Background(), url, pgstore.Options{Clock: clk})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		exp, err := otelexport.Start(context.Background(), otelexport.Config{PrometheusListen: "127.0.0.1:0"},
			otelexport.Resource{ServiceName: "trainmeter-collector", InstanceID: fmt.Sprint(i)}, nil)
		if err != nil {
			t.Fatal(err)
		}
		tel, err := New(Options{Exporter: exp, Runs: st, Nodes: ingest.New(st, nil), Clock: clk, RunWindow: time.Minute,
			Fleet: &Fleet{Leading: func() bool { return leader.Load() == i }, Runs: st}})
		if err != nil {
			_ = exp.Shutdown(context.Background())
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = tel.Shutdown(context.Background()) }) // before the store closes (cleanups run last first)
		return replica{st, tel}
	}
	rs := []replica{start(0), start(1)}
	apply := func(r replica, node string, seq uint64, run string) {
		t.Helper()
		b := runBatch(seq, clk.Now(), run)
		if _, err := r.st.ApplyBatchResult(storage.Sender{Node: node, Boot: "boot"}, b); err != nil {
			t.Fatal(err)
		}
		r.tel.OnApplied(node, b)
	}
	exported := func(r replica) string {
		t.Helper()
		var ids []string
		text := scrape(t, r.tel)
		for _, id := range []string{"a", "b"} {
			if _, ok := sample(text, "trainmeter_run_tokens_total", fmt.Sprintf(`trainmeter_run_id="%s"`, id)); ok {
				ids = append(ids, id)
			}
		}
		return strings.Join(ids, ",")
	}
	apply(rs[0], "n0", 1, "a")
	apply(rs[1], "n1", 1, "b")
	if a, b := exported(rs[0]), exported(rs[1]); a != "a,b" || b != "" {
		t.Fatalf("leader 0 exports %q, collector 1 %q; want a,b and none", a, b)
	}
	leader.Store(1)
	if a, b := exported(rs[0]), exported(rs[1]); a != "" || b != "a,b" {
		t.Fatalf("after the lead moved: collector 0 exports %q, leader 1 %q; want none and a,b", a, b)
	}
	clk.Advance(40 * time.Second)
	apply(rs[0], "n0", 2, "a")
	clk.Advance(40 * time.Second) // b's data is 80 s old, past RunWindow
	if got := exported(rs[1]); got != "a" {
		t.Fatalf("leader exports %q, want a (b had no data within RunWindow)", got)
	}
}
