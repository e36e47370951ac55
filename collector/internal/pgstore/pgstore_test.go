package pgstore_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/trainmeter/trainmeter/collector/internal/aggregate"
	"github.com/trainmeter/trainmeter/collector/internal/fold"
	"github.com/trainmeter/trainmeter/collector/internal/pgstore"
	"github.com/trainmeter/trainmeter/collector/internal/storage"
	"github.com/trainmeter/trainmeter/collector/internal/storage/storagetest"
	tu "github.com/trainmeter/trainmeter/collector/internal/testutil"
	"github.com/trainmeter/trainmeter/internal/pgtest"
	"github.com/trainmeter/trainmeter/pkg/clock"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func open(t *testing.T, url string) *pgstore.Store {
	t.Helper()
	return openWith(t, url, pgstore.Options{})
}

func openWith(t *testing.T, url string, o pgstore.Options) *pgstore.Store {
	t.Helper()
	st, err := pgstore.Open(context.Background(), url, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// reopenable is a store the suite can restart: a new Store on the same
// database.
type reopenable struct {
	*pgstore.Store
	url string
	o   pgstore.Options
}

func (r reopenable) Reopen(t *testing.T) storage.Store {
	r.Close()
	r.Store = openWith(t, r.url, r.o)
	return r
}

func TestConformance(t *testing.T) {
	storagetest.Run(t, func(t *testing.T, so storagetest.Options) storage.Store {
		url := pgtest.DB(t)
		o := pgstore.Options{Clock: so.Clock, Limits: so.Limits}
		return reopenable{openWith(t, url, o), url, o}
	})
}

// TestTwoCollectorsOneRun: two stores on one database (two collectors)
// apply the same batches of one run from several nodes at once: each
// batch is applied once, and no window is lost from the run's aggregate.
func TestTwoCollectorsOneRun(t *testing.T) {
	url := pgtest.DB(t)
	a, b := open(t, url), open(t, url)
	const nodes, batches = 4, 25
	for n := range nodes {
		node := fmt.Sprint("n", n)
		if _, err := a.ApplyBatchResult(storage.Sender{Node: node, Boot: "b"}, tu.Batch(1, 0, []*trainmeterv1.RunWindow{tu.Window("r", 0, 1, 1)}, tu.Start("r", 0, "m"))); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	applied := 0
	for n := range nodes {
		for _, st := range []*pgstore.Store{a, b} {
			wg.Go(func() {
				node := fmt.Sprint("n", n)
				for seq := uint64(2); seq <= batches; seq++ {
					sec := float64(seq - 1)
					r, err := st.ApplyBatchResult(storage.Sender{Node: node, Boot: "b"}, tu.Batch(seq, sec, []*trainmeterv1.RunWindow{tu.Window("r", sec, 10, 5)}))
					if err != nil {
						t.Error(err)
						return
					}
					if !r.Duplicate {
						mu.Lock()
						applied++
						mu.Unlock()
					}
				}
			})
		}
	}
	wg.Wait()
	if want := nodes * (batches - 1); applied != want {
		t.Errorf("%d batches applied, want %d (each once)", applied, want)
	}
	for _, st := range []*pgstore.Store{a, b} {
		s, err := st.GetRun("r")
		if err != nil {
			t.Fatal(err)
		}
		r := s.Report(aggregate.Pricing{})
		if want := uint64(nodes * (1 + 10*(batches-1))); r.GetTokensProcessed() != want || r.GetNodes() != nodes {
			t.Errorf("tokens %d on %d nodes, want %d on %d: an update was lost", r.GetTokensProcessed(), r.GetNodes(), want, nodes)
		}
		ws, _, err := st.RunTimeline("r")
		if err != nil || len(ws) != nodes*batches {
			t.Errorf("%d windows (%v), want %d", len(ws), err, nodes*batches)
		}
	}
}

// TestLimitsAcrossCollectors: two collectors on one database hold a node
// to one set of limits, whichever applies its batches: concurrent starts
// past the live bound are refused, and the new-run bucket is shared.
func TestLimitsAcrossCollectors(t *testing.T) {
	url := pgtest.DB(t)
	clk := clock.NewFake(tu.Now())
	o := pgstore.Options{Clock: clk, Limits: fold.Limits{MaxLiveRunsPerNode: 3, MaxNewRunsPerMinute: 5}}
	stores := []*pgstore.Store{openWith(t, url, o), openWith(t, url, o)}
	n := storage.Sender{Node: "n", Boot: "b"}
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			run := fmt.Sprint("r", i)
			if _, err := stores[i%2].ApplyBatchResult(n, tu.Batch(uint64(i+1), float64(i), nil, tu.Start(run, float64(i), "m"))); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	runs, err := stores[0].ListRuns(nil)
	if err != nil || len(runs) != 3 {
		t.Fatalf("%d runs (%v) from 8 concurrent starts, want 3 (the live bound)", len(runs), err)
	}
	end := tu.Batch(9, 10, nil)
	for _, r := range runs {
		end.RunEvents = append(end.RunEvents, tu.End(r.RunId, 10))
	}
	if _, err := stores[1].ApplyBatchResult(n, end); err != nil {
		t.Fatal(err)
	}
	// 3 of the bucket's 5 were taken: 2 more new runs, whichever collector.
	for i, want := range []string{"", "", "x3"} {
		run := fmt.Sprint("x", i+1)
		a, err := stores[i%2].ApplyBatchResult(n, tu.Batch(uint64(10+i), float64(11+i), nil, tu.Start(run, float64(11+i), "m")))
		if err != nil {
			t.Fatal(err)
		}
		got := ""
		for _, r := range a.Refused {
			got += r.RunID
			if !strings.Contains(r.Reason, "new runs a minute") {
				t.Errorf("%s refused for %q, want the new-run limit", r.RunID, r.Reason)
			}
		}
		if got != want {
			t.Errorf("start of %s: refused %q, want %q", run, got, want)
		}
	}
}

// TestNewerSchemaRefused: a database migrated by a newer trainmeter is
// refused with an error that says so; an up-to-date one opens again.
func TestNewerSchemaRefused(t *testing.T) {
	url := pgtest.DB(t)
	open(t, url).Close()
	open(t, url).Close()
	c, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	if _, err := c.Exec(context.Background(), "INSERT INTO schema_version (version) VALUES (999)"); err != nil {
		t.Fatal(err)
	}
	st, err := pgstore.Open(context.Background(), url, pgstore.Options{})
	if err == nil {
		st.Close()
		t.Fatal("a database with a newer schema opened")
	}
	if !strings.Contains(err.Error(), "schema version 999, newer than this trainmeter knows") {
		t.Errorf("error %q does not say the schema is newer", err)
	}
}

// TestConcurrentOpen: collectors starting at once on an empty database
// migrate it once (the advisory lock) and all open.
func TestConcurrentOpen(t *testing.T) {
	url := pgtest.DB(t)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			st, err := pgstore.Open(context.Background(), url, pgstore.Options{})
			if err != nil {
				t.Error(err)
				return
			}
			st.Close()
		})
	}
	wg.Wait()
}

func TestRedact(t *testing.T) {
	for in, want := range map[string]string{
		"postgres://u:secret@db:5432/tm?sslmode=require": "postgres://u:xxxxx@db:5432/tm?sslmode=require",
		"postgres://u@db/tm?password=secret":             "postgres://u@db/tm?password=xxxxx",
		"postgres://u@db/tm":                             "postgres://u@db/tm",
	} {
		if got := pgstore.Redact(in); got != want || strings.Contains(got, "secret") {
			t.Errorf("Redact(%q) = %q, want %q", in, got, want)
		}
	}
}
