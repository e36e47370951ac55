package server_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"math"
	"net"
	"sort"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"

	"github.com/trainmeter/trainmeter/collector/internal/alert"
	"github.com/trainmeter/trainmeter/collector/internal/server"
	tu "github.com/trainmeter/trainmeter/collector/internal/testutil"
	"github.com/trainmeter/trainmeter/internal/testkit"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, testkit.GoleakOptions()...)
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func start(t *testing.T, cfg server.Config) *server.Server {
	t.Helper()
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:0"
	}
	if cfg.DataDir == "" {
		cfg.DataDir = t.TempDir()
	}
	if cfg.Clock == nil {
		cfg.Clock = tu.Clock() // the test batches are dated around tu.T0
	}
	srv := server.New(cfg, quiet())
	if err := srv.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			t.Error(err)
		}
	})
	return srv
}

func getRun(t *testing.T, q trainmeterv1.QueryServiceClient, id string) *trainmeterv1.RunReport {
	t.Helper()
	resp, err := q.GetRun(t.Context(), &trainmeterv1.GetRunRequest{RunId: id})
	if err != nil {
		t.Fatal(err)
	}
	return resp.GetRun()
}

func TestIngestAndQuery(t *testing.T) {
	srv := start(t, server.Config{GPUPricePerHour: 3.6, EnergyPricePerKWh: 0.2, GridGCO2PerKWh: 300})
	conn := tu.Dial(t, srv.Addr().String())
	q := trainmeterv1.NewQueryServiceClient(conn)

	n1 := tu.Connect(t, conn, "node-1", "boot-a")
	n1.MustAck(tu.Batch(1, 0, []*trainmeterv1.RunWindow{tu.Window("run-1", 0, 1000, 300)}, tu.Start("run-1", 0, "llama")))
	// Acked means stored: the query sees it at once.
	if r := getRun(t, q, "run-1"); r.GetTokensProcessed() != 1000 || r.GetEnergyJ() != 300 {
		t.Fatalf("after first ack: tokens %d energy %v", r.GetTokensProcessed(), r.GetEnergyJ())
	}

	// A resend of the same (node, boot, seq) is acked but not counted twice.
	n1.MustAck(tu.Batch(1, 0, []*trainmeterv1.RunWindow{tu.Window("run-1", 0, 1000, 300)}, tu.Start("run-1", 0, "llama")))
	if r := getRun(t, q, "run-1"); r.GetTokensProcessed() != 1000 || r.GetEnergyJ() != 300 || r.GetEnergyTotalJ() != 300 {
		t.Fatalf("after resend: tokens %d energy %v", r.GetTokensProcessed(), r.GetEnergyJ())
	}

	// A second node joins the run; its run_start does not overwrite metadata.
	n2 := tu.Connect(t, conn, "node-2", "boot-b")
	n2.MustAck(tu.Batch(1, 0.5, []*trainmeterv1.RunWindow{tu.Window("run-1", 0.5, 2500, 200)}, tu.Start("run-1", 0.5, "other")))
	n1.MustAck(tu.Batch(2, 1, []*trainmeterv1.RunWindow{tu.Window("run-1", 1, 1000, 300)}, tu.End("run-1", 2)))

	// Invalid batches: rejected, nothing stored, the stream goes on.
	for name, b := range tu.Invalid(3) {
		if reason := n1.MustReject(b); reason == "" {
			t.Errorf("%s: empty reject reason", name)
		}
	}
	r := getRun(t, q, "run-1")
	if r.GetTokensProcessed() != 4500 || r.GetEnergyJ() != 800 {
		t.Fatalf("after rejects: tokens %d energy %v", r.GetTokensProcessed(), r.GetEnergyJ())
	}
	if r.GetEnded() {
		t.Fatal("ended before node-2 sent run_end")
	}
	n2.MustAck(tu.Batch(2, 1.5, []*trainmeterv1.RunWindow{tu.Window("run-1", 1.5, 500, 100)}, tu.End("run-1", 2.5)))
	n1.MustAck(tu.Batch(3, 5, []*trainmeterv1.RunWindow{tu.Window("run-2", 5, 10, 1)}, tu.Start("run-2", 5, "tiny")))

	r = getRun(t, q, "run-1")
	want := map[string][2]float64{
		"tokens_processed": {float64(r.GetTokensProcessed()), 5000},
		"tokens_measured":  {float64(r.GetTokensMeasured()), 5000},
		"energy_J":         {r.GetEnergyJ(), 900},
		"wall_s":           {r.GetWallS(), 2.5},
		"warmup_s":         {r.GetWarmupS(), 0},
		"avg_power_W":      {r.GetAvgPowerW(), 360},
		"tok_per_s":        {r.GetTokPerS(), 2000},
		"J_per_token":      {r.GetJPerToken(), 0.18},
		"nodes":            {float64(r.GetNodes()), 2},
		"gpus":             {float64(r.GetGpus()), 2},
		// second 0: node-1 300*1.2 + node-2 200*1.2 = 600; second 1: 360 + 120 = 480
		"peak_power_W": {r.GetPeakPowerW(), 600},
		"gpu_hours":    {r.GetGpuHours(), 4.0 / 3600},
		"cost_usd":     {r.GetCostUsd(), 0.004},
		"energy_kWh":   {r.GetEnergyKwh(), 900 / 3.6e6},
		"co2_kg":       {r.GetCo2Kg(), 900 / 3.6e6 * 0.3},
	}
	for name, gw := range want {
		if math.Abs(gw[0]-gw[1]) > 1e-9 {
			t.Errorf("%s = %v, want %v", name, gw[0], gw[1])
		}
	}
	if !r.GetEnded() || r.GetMetadata().GetModel() != "llama" || r.GetEnergyMethod() != "counter" || r.CostUsd == nil {
		t.Errorf("ended %v model %q method %q cost %v", r.GetEnded(), r.GetMetadata().GetModel(), r.GetEnergyMethod(), r.CostUsd)
	}

	// ListRuns: all, ordered by run id; and by id.
	lr, err := q.ListRuns(t.Context(), &trainmeterv1.ListRunsRequest{})
	if err != nil || len(lr.GetRuns()) != 2 || lr.GetRuns()[0].GetRunId() != "run-1" {
		t.Fatalf("ListRuns: %v %v", lr, err)
	}
	lr, err = q.ListRuns(t.Context(), &trainmeterv1.ListRunsRequest{RunIds: []string{"run-2"}})
	if err != nil || len(lr.GetRuns()) != 1 || lr.GetRuns()[0].GetTokensProcessed() != 10 {
		t.Fatalf("ListRuns(run-2): %v %v", lr, err)
	}
	if _, err := q.ListRuns(t.Context(), &trainmeterv1.ListRunsRequest{RunIds: []string{"nope"}}); status.Code(err) != codes.NotFound {
		t.Fatalf("ListRuns(nope): %v", err)
	}
	if _, err := q.GetRun(t.Context(), &trainmeterv1.GetRunRequest{RunId: "nope"}); status.Code(err) != codes.NotFound {
		t.Fatalf("GetRun(nope): %v", err)
	}

	// ExportRuns streams the same reports.
	stream, err := q.ExportRuns(t.Context(), &trainmeterv1.ExportRunsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for {
		m, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, m.GetRun().GetRunId())
		if m.GetRun().GetRunId() == "run-1" && m.GetRun().GetTokensProcessed() != 5000 {
			t.Errorf("export run-1 tokens = %d", m.GetRun().GetTokensProcessed())
		}
	}
	if len(ids) != 2 {
		t.Fatalf("exported %v", ids)
	}
	stream, err = q.ExportRuns(t.Context(), &trainmeterv1.ExportRunsRequest{RunIds: []string{"run-2", "missing"}})
	if err == nil {
		_, err = stream.Recv()
	}
	if status.Code(err) != codes.NotFound {
		t.Fatalf("export of a missing run: %v", err)
	}

	// Nodes.
	nodes, err := q.ListNodes(t.Context(), &trainmeterv1.ListNodesRequest{})
	if err != nil || len(nodes.GetNodes()) != 2 {
		t.Fatalf("ListNodes: %v %v", nodes, err)
	}
	for _, n := range nodes.GetNodes() {
		if !n.GetConnected() || n.GetLastSeen() == nil || len(n.GetGpus()) != 1 {
			t.Errorf("node %v", n)
		}
	}
	if n := nodes.GetNodes()[0]; n.GetNode() != "node-1" || n.GetLastSeq() != 3 || n.GetBootId() != "boot-a" {
		t.Errorf("node-1: %v", n)
	}
}

func TestRestartKeepsData(t *testing.T) {
	dir := t.TempDir()
	cfg := server.Config{Listen: "127.0.0.1:0", DataDir: dir, Clock: tu.Clock()}
	srv := server.New(cfg, quiet())
	if err := srv.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	conn := tu.Dial(t, srv.Addr().String())
	a := tu.Connect(t, conn, "n", "b")
	a.MustAck(tu.Batch(1, 0, []*trainmeterv1.RunWindow{tu.Window("r", 0, 42, 7)}, tu.Start("r", 0, "m")))
	// Shut down with the agent's stream still open: it must not hang.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Stream.Recv(); status.Code(err) != codes.Unavailable {
		t.Fatalf("agent stream after shutdown: %v", err)
	}

	srv2 := start(t, cfg)
	conn2 := tu.Dial(t, srv2.Addr().String())
	q := trainmeterv1.NewQueryServiceClient(conn2)
	if r := getRun(t, q, "r"); r.GetTokensProcessed() != 42 || r.GetEnergyJ() != 7 || r.GetMetadata().GetModel() != "m" {
		t.Fatalf("after restart: %v", r)
	}
	// The dedup marks survived too: the agent resends its unacked batch.
	a2 := tu.Connect(t, conn2, "n", "b")
	a2.MustAck(tu.Batch(1, 0, []*trainmeterv1.RunWindow{tu.Window("r", 0, 42, 7)}))
	if r := getRun(t, q, "r"); r.GetTokensProcessed() != 42 {
		t.Fatalf("resend after restart counted twice: %d", r.GetTokensProcessed())
	}
}

func TestReflectionAndHealth(t *testing.T) {
	srv := start(t, server.Config{})
	conn := tu.Dial(t, srv.Addr().String())

	rc, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if err := rc.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	resp, err := rc.Recv()
	if err != nil {
		t.Fatal(err)
	}
	_ = rc.CloseSend()
	var names []string
	for _, s := range resp.GetListServicesResponse().GetService() {
		names = append(names, s.GetName())
	}
	sort.Strings(names)
	for _, want := range []string{"trainmeter.v1.IngestService", "trainmeter.v1.QueryService", "grpc.health.v1.Health"} {
		i := sort.SearchStrings(names, want)
		if i == len(names) || names[i] != want {
			t.Errorf("reflection lists %v, missing %s", names, want)
		}
	}

	hc := healthpb.NewHealthClient(conn)
	for _, svc := range []string{"", "trainmeter.v1.IngestService", "trainmeter.v1.QueryService"} {
		h, err := hc.Check(t.Context(), &healthpb.HealthCheckRequest{Service: svc})
		if err != nil || h.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("health %q: %v %v", svc, h, err)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	good := server.Config{Listen: "127.0.0.1:7433", DataDir: "x"}
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]server.Config{
		"no listen":   {DataDir: "x"},
		"bad listen":  {Listen: "nohostport", DataDir: "x"},
		"no data":     {Listen: ":1"},
		"neg price":   {Listen: ":1", DataDir: "x", GPUPricePerHour: -1},
		"nan energy":  {Listen: ":1", DataDir: "x", EnergyPricePerKWh: math.NaN()},
		"inf co2":     {Listen: ":1", DataDir: "x", GridGCO2PerKWh: math.Inf(1)},
		"negative gc": {Listen: ":1", DataDir: "x", GCInterval: -time.Second},
	} {
		if err := c.Validate(); err == nil {
			t.Errorf("%s: Validate accepted %+v", name, c)
		}
	}
	if err := server.New(server.Config{}, quiet()).Start(t.Context()); err == nil {
		t.Error("Start accepted an empty config")
	}
	// Shutdown without Start is a no-op.
	if err := server.New(good, quiet()).Shutdown(t.Context()); err != nil {
		t.Error(err)
	}
}

// TestStoreRunsOnTheConfiguredClock: Config.Now is the clock of what the
// store stamps too (a node's last-seen time, kept across a restart), not
// only of ingest's checks.
func TestStoreRunsOnTheConfiguredClock(t *testing.T) {
	cfg := server.Config{Listen: "127.0.0.1:0", DataDir: t.TempDir(), Clock: tu.Clock()}
	srv := server.New(cfg, quiet())
	if err := srv.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	a := tu.Connect(t, tu.Dial(t, srv.Addr().String()), "n", "b")
	a.MustAck(tu.Batch(1, 0, []*trainmeterv1.RunWindow{tu.Window("r", 0, 42, 7)}, tu.Start("r", 0, "m")))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}

	// No agent connected: the node's last-seen time is the stored one.
	srv2 := start(t, cfg)
	q := trainmeterv1.NewQueryServiceClient(tu.Dial(t, srv2.Addr().String()))
	nodes, err := q.ListNodes(t.Context(), &trainmeterv1.ListNodesRequest{})
	if err != nil || len(nodes.GetNodes()) != 1 {
		t.Fatalf("nodes %v %v", nodes, err)
	}
	if got := nodes.GetNodes()[0].GetLastSeen().AsTime(); !got.Equal(tu.Now()) {
		t.Errorf("stored last-seen %v, want the configured clock's %v", got, tu.Now())
	}
}

// TestNilLoggerDiscards: a nil logger means the same as in the agent:
// nothing is logged, not even to the process-wide default logger.
func TestNilLoggerDiscards(t *testing.T) {
	var logged testkit.Buffer
	prev := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&logged, nil)))
	defer slog.SetDefault(prev)
	srv := server.New(server.Config{Listen: "127.0.0.1:0", DataDir: t.TempDir(), Clock: tu.Clock()}, nil)
	if err := srv.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if out := logged.String(); out != "" {
		t.Errorf("a collector with a nil logger wrote to the default logger:\n%s", out)
	}
}

// TestFailedStartUndoesWhatItStarted: when a late step of Start fails (the
// status listener's address is taken), what was started before it is shut
// down: the gRPC address and the data directory can be used again, and no
// background loop is left running (goleak checks the last).
func TestFailedStartUndoesWhatItStarted(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	cfg := server.Config{Listen: testkit.FreeAddr(t), DataDir: t.TempDir(), Clock: tu.Clock(), StatusListen: taken.Addr().String(),
		Alerts: server.AlertConfig{Webhook: alert.WebhookConfig{URLs: []string{"http://127.0.0.1:9/hook"}}}}
	if err := server.New(cfg, quiet()).Start(t.Context()); err == nil {
		t.Fatal("start with a taken status address: no error")
	}
	cfg.StatusListen = ""
	srv := start(t, cfg)
	if srv.Addr().String() != cfg.Listen {
		t.Errorf("listening on %s, want %s again", srv.Addr(), cfg.Listen)
	}
}
