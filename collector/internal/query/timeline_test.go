package query_test

import (
	"context"
	"io"
	"log/slog"
	"math"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/trainmeter/trainmeter/collector/internal/server"
	tu "github.com/trainmeter/trainmeter/collector/internal/testutil"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

func startCollector(t testing.TB) string {
	srv := server.New(server.Config{Listen: "127.0.0.1:0", DataDir: t.TempDir(), Clock: tu.Clock()},
		slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err := srv.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	})
	return srv.Addr().String()
}

func seriesByName(t *testing.T, r *trainmeterv1.TimelineResponse) map[string]*trainmeterv1.TimelineSeries {
	t.Helper()
	out := map[string]*trainmeterv1.TimelineSeries{}
	for _, s := range r.GetSeries() {
		if len(s.GetTUnixMs()) != len(s.GetValues()) {
			t.Fatalf("series %s: %d times, %d values", s.GetName(), len(s.GetTUnixMs()), len(s.GetValues()))
		}
		out[s.GetName()] = s
	}
	return out
}

// TestTimeline feeds a real collector a two-node run (warmup, an eval, a
// power spike) over real gRPC and reads its timeline back.
func TestTimeline(t *testing.T) {
	addr := startCollector(t)
	conn := tu.Dial(t, addr)
	n1, n2 := tu.Connect(t, conn, "n1", "b"), tu.Connect(t, conn, "n2", "b")
	const secs = 60
	for s := range secs {
		sec := float64(s)
		joules := 100.0
		if s == 37 {
			joules = 900 // a spike that downsampling must keep
		}
		w1, w2 := tu.Window("r", sec, 50, joules), tu.Window("r", sec, 30, 50)
		if s < 5 {
			w1.Phase, w2.Phase = trainmeterv1.Phase_PHASE_WARMUP, trainmeterv1.Phase_PHASE_WARMUP
		}
		var ev1, ev2 []*trainmeterv1.RunEvent
		switch s {
		case 0:
			ev1, ev2 = []*trainmeterv1.RunEvent{tu.Start("r", 0, "m")}, []*trainmeterv1.RunEvent{tu.Start("r", 0, "m")}
		case 30:
			ev1 = []*trainmeterv1.RunEvent{{Event: &trainmeterv1.RunEvent_Eval{Eval: &trainmeterv1.Eval{
				RunId: "r", Time: tu.TS(30.5), Epoch: proto.Int64(1), ValLoss: proto.Float64(2.5)}}}}
		case secs - 1:
			ev1, ev2 = []*trainmeterv1.RunEvent{tu.End("r", secs)}, []*trainmeterv1.RunEvent{tu.End("r", secs)}
		}
		n1.MustAck(tu.Batch(uint64(s+1), sec, []*trainmeterv1.RunWindow{w1}, ev1...))
		n2.MustAck(tu.Batch(uint64(s+1), sec, []*trainmeterv1.RunWindow{w2}, ev2...))
	}
	q := trainmeterv1.NewQueryServiceClient(conn)
	ctx := context.Background()
	rep, err := q.GetRun(ctx, &trainmeterv1.GetRunRequest{RunId: "r"})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := q.Timeline(ctx, &trainmeterv1.TimelineRequest{RunId: "r"})
	if err != nil {
		t.Fatal(err)
	}
	ss := seriesByName(t, resp)
	for _, name := range []string{"power_w", "power_w:n1", "power_w:n2", "power_w:n1/gpu0", "power_w:n2/gpu0", "energy_j", "tok_per_s", "j_per_token", "vram_peak_mib", "data_wait_s", "compute_s"} {
		if s := ss[name]; s == nil || len(s.GetValues()) != secs || s.GetSourcePoints() != secs {
			t.Errorf("series %s: %v, want %d points", name, s, secs)
		}
	}
	if got := ss["power_w"].GetValues()[10]; got != 150 {
		t.Errorf("power at 10 s = %v W, want 100 + 50", got)
	}
	if got := ss["power_w"].GetValues()[37]; got != 950 {
		t.Errorf("power at 37 s = %v W, want 900 + 50", got)
	}
	if got := ss["power_w:n1/gpu0"].GetValues()[20]; got != 100 {
		t.Errorf("GPU 0 of n1 at 20 s: %v W, want the GPU window's 100", got)
	}
	if len(ss) != 11 {
		t.Errorf("%d series, want 11", len(ss))
	}
	e := ss["energy_j"].GetValues()
	if math.Abs(e[len(e)-1]-rep.GetRun().GetEnergyTotalJ()) > 1e-6 {
		t.Errorf("cumulative energy ends at %v J, the report's energy_total_J is %v", e[len(e)-1], rep.GetRun().GetEnergyTotalJ())
	}
	if got := ss["tok_per_s"].GetValues()[3]; got != 80 {
		t.Errorf("tok/s = %v, want 50 + 30", got)
	}
	if got := ss["j_per_token"].GetValues()[10]; math.Abs(got-150.0/80) > 1e-12 {
		t.Errorf("J/token = %v, want 150/80", got)
	}
	if !resp.GetWarmupEnd().AsTime().Equal(tu.TS(5).AsTime()) {
		t.Errorf("warmup_end %v, want 5 s after the start", resp.GetWarmupEnd().AsTime())
	}
	var kinds []string
	for _, ev := range resp.GetEvents() {
		kinds = append(kinds, ev.GetKind()+"@"+ev.GetNode())
	}
	if got := strings.Join(kinds, " "); got != "run_start@n1 run_start@n2 warmup_end@ eval@n1 run_end@n1 run_end@n2" {
		t.Errorf("events %s", got)
	}
	if ev := resp.GetEvents()[3]; ev.GetText() != "eval epoch 1 val_loss 2.5" {
		t.Errorf("eval text %q", ev.GetText())
	}

	// Downsampled to 10 points, the spike survives; a range and a series
	// choice narrow the answer.
	small, err := q.Timeline(ctx, &trainmeterv1.TimelineRequest{RunId: "r", Series: []string{"power_w"}, MaxPoints: 10})
	if err != nil {
		t.Fatal(err)
	}
	p := small.GetSeries()[0]
	if len(small.GetSeries()) != 1 || len(p.GetValues()) > 10 || !containsValue(p.GetValues(), 950) || p.GetSourcePoints() != secs {
		t.Errorf("downsampled %v", p)
	}
	rng, err := q.Timeline(ctx, &trainmeterv1.TimelineRequest{RunId: "r", Series: []string{"energy_j"}, From: tu.TS(10), To: tu.TS(20)})
	if err != nil {
		t.Fatal(err)
	}
	if v := rng.GetSeries()[0].GetValues(); len(v) != 10 || v[9] != 1500 {
		t.Errorf("energy over [10 s, 20 s): %v, want 10 points ending at 1500 J", v)
	}
	for _, tc := range []struct {
		req  *trainmeterv1.TimelineRequest
		code codes.Code
		want string
	}{
		{&trainmeterv1.TimelineRequest{RunId: "nope"}, codes.NotFound, `run "nope" not found`},
		{&trainmeterv1.TimelineRequest{}, codes.InvalidArgument, "run_id is empty"},
		{&trainmeterv1.TimelineRequest{RunId: "r", Series: []string{"watts"}}, codes.InvalidArgument, "unknown series watts"},
		{&trainmeterv1.TimelineRequest{RunId: "r", MaxPoints: 3}, codes.InvalidArgument, "want at least 10"},
		{&trainmeterv1.TimelineRequest{RunId: "r", From: tu.TS(5), To: tu.TS(5)}, codes.InvalidArgument, "is not after"},
	} {
		_, err := q.Timeline(ctx, tc.req)
		if status.Code(err) != tc.code || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want %v %q", tc.req, err, tc.code, tc.want)
		}
	}
}

func containsValue(vs []float64, want float64) bool {
	for _, v := range vs {
		if v == want {
			return true
		}
	}
	return false
}
