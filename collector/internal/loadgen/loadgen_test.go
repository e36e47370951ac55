package loadgen

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/trainmeter/trainmeter/collector/internal/server"
	"github.com/trainmeter/trainmeter/internal/pgtest"
	"github.com/trainmeter/trainmeter/internal/testkit"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, testkit.GoleakOptions()...)
}

// The load generator drives a real in-process collector over loopback gRPC:
// batches are acked, the runs it reports exist in the collector with the
// tokens of the acked batches, and a probe run becomes visible.
func TestLoadAgainstRealCollector(t *testing.T) {
	srv := server.New(server.Config{Listen: "127.0.0.1:0", DataDir: t.TempDir()}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err := srv.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			t.Error(err)
		}
	}()
	addr := srv.Addr().String()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := Run(ctx, Config{Addrs: []string{addr}, Agents: 4, GPUs: 8, Runs: 2, Interval: 100 * time.Millisecond,
		Duration: 2 * time.Second, PIDs: []int{os.Getpid()}, RunPrefix: "t-"})
	if err != nil {
		t.Fatal(err)
	}
	t.Log(res)
	if res.Acked == 0 || res.StreamErrors != 0 || res.Rejected != 0 || res.AckP99 <= 0 || res.GPUSamplesPerSec <= 0 || res.CollectorCPU <= 0 {
		t.Fatalf("unexpected result: %+v", res)
	}

	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	q := trainmeterv1.NewQueryServiceClient(conn)
	resp, err := q.ListRuns(ctx, &trainmeterv1.ListRunsRequest{RunIds: []string{"t-run-000000", "t-run-000001"}})
	if err != nil {
		t.Fatal(err)
	}
	var tokens uint64
	for _, r := range resp.GetRuns() {
		tokens += r.GetTokensProcessed()
	}
	// Every acked batch carries 65536 tokens; so does each agent's first
	// batch, sent before the measured span, and batches acked after it.
	if min := (res.Acked + 4) * 65536; tokens < min {
		t.Errorf("runs hold %d tokens, want at least %d (%d acked batches)", tokens, min, res.Acked)
	}

	d, err := Visibility(ctx, addr, fmt.Sprint(time.Now().UnixNano()))
	if err != nil || d <= 0 {
		t.Fatalf("visibility probe: %v, %v", d, err)
	}
}

func TestConfigValidate(t *testing.T) {
	if err := (Config{}).Validate(); err == nil {
		t.Error("empty config: want an error")
	}
	ok := Config{Addrs: []string{"127.0.0.1:1"}, Agents: 1, GPUs: 8, Interval: time.Second, Duration: time.Second}
	if err := ok.Validate(); err != nil {
		t.Errorf("valid config: %v", err)
	}
}

// Two collectors on one PostgreSQL database (internal/pgtest): the agents
// are spread over both, every batch is acked, and the database's CPU time
// (the postmaster and its backends) is counted with theirs. EmptyDB then
// leaves no table for the next load point.
func TestLoadAgainstReplicasOnPostgreSQL(t *testing.T) {
	url := pgtest.ServerDB(t)
	var addrs []string
	for range 2 {
		srv := server.New(server.Config{Listen: "127.0.0.1:0", StoreURL: url}, slog.New(slog.NewTextHandler(io.Discard, nil)))
		if err := srv.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		defer func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := srv.Shutdown(ctx); err != nil {
				t.Error(err)
			}
		}()
		addrs = append(addrs, srv.Addr().String())
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db, err := PostmasterPID(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	res, err := Run(ctx, Config{Addrs: addrs, Agents: 4, GPUs: 8, Interval: 200 * time.Millisecond,
		Duration: 2 * time.Second, PIDs: []int{os.Getpid()}, DBPID: db, RunPrefix: "pg-"})
	if err != nil {
		t.Fatal(err)
	}
	t.Log(res)
	if res.Acked == 0 || res.StreamErrors != 0 || res.Rejected != 0 || res.AckP99 <= 0 || res.DatabaseCPU <= 0 {
		t.Fatalf("unexpected result: %+v", res)
	}
	if len(res.AckedPerReplica) != 2 || res.AckedPerReplica[0] == 0 || res.AckedPerReplica[1] == 0 {
		t.Errorf("acked per replica %v, want both replicas to have taken batches", res.AckedPerReplica)
	}
	if want := float64(res.Acked) * 8 / (res.CollectorCPU + res.DatabaseCPU).Seconds(); res.SamplesPerCPUSecond() != want {
		t.Errorf("samples per CPU-second %v, want %v (collectors and database)", res.SamplesPerCPUSecond(), want)
	}

	if err := EmptyDB(ctx, url); err != nil {
		t.Fatal(err)
	}
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	var n int
	if err := c.QueryRow(ctx, "SELECT count(*) FROM pg_tables WHERE schemaname = current_schema()").Scan(&n); err != nil || n != 0 {
		t.Errorf("after EmptyDB: %d tables (%v), want none", n, err)
	}
}
