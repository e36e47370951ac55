package ingest

import (
	"math"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/trainmeter/trainmeter/collector/internal/aggregate"
	tu "github.com/trainmeter/trainmeter/collector/internal/testutil"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"

	"github.com/trainmeter/trainmeter/pkg/clock"
)

// malformed returns one batch per broken field, each otherwise valid, with a
// substring its reject reason must contain.
func malformed(seq uint64) []struct {
	name, want string
	b          *trainmeterv1.Batch
} {
	type row = struct {
		name, want string
		b          *trainmeterv1.Batch
	}
	var rows []row
	add := func(name, want string, mut func(b *trainmeterv1.Batch)) {
		b := tu.Batch(seq, 0, []*trainmeterv1.RunWindow{tu.Window("r", 0, 10, 5)}, tu.Start("r", 0, "m"),
			&trainmeterv1.RunEvent{Event: &trainmeterv1.RunEvent_Eval{Eval: &trainmeterv1.Eval{RunId: "r", Time: tu.TS(0.5)}}})
		mut(b)
		rows = append(rows, row{name, want, b})
	}
	w := func(b *trainmeterv1.Batch) *trainmeterv1.RunWindow { return b.RunWindows[0] }
	g := func(b *trainmeterv1.Batch) *trainmeterv1.GpuWindow { return b.GpuWindows[0] }
	add("seq 0", "seq must be > 0", func(b *trainmeterv1.Batch) { b.Seq = 0 })
	add("seq 2^64-1", "seq 18446744073709551615 is implausibly large", func(b *trainmeterv1.Batch) { b.Seq = math.MaxUint64 })
	add("no window_start", "window_start is missing", func(b *trainmeterv1.Batch) { b.WindowStart = nil })
	add("invalid timestamp", "window_end", func(b *trainmeterv1.Batch) { b.WindowEnd = &timestamppb.Timestamp{Seconds: 1, Nanos: 2e9} })
	add("window backwards", "window_end is before window_start", func(b *trainmeterv1.Batch) { b.WindowEnd = tu.TS(-1) })
	add("window of a day", "window spans 24h0m0s", func(b *trainmeterv1.Batch) { b.WindowEnd = tu.TS(86400) })
	add("gpu NaN energy", "energy_counter_j is not finite", func(b *trainmeterv1.Batch) { g(b).EnergyCounterJ = math.NaN() })
	add("gpu -Inf power", "power_max_w is not finite", func(b *trainmeterv1.Batch) { g(b).PowerMaxW = math.Inf(-1) })
	add("gpu negative memory", "memory_used_max_mib is negative", func(b *trainmeterv1.Batch) { g(b).MemoryUsedMaxMib = -1 })
	add("gpu huge power (1e300)", "power_avg_w is implausibly large", func(b *trainmeterv1.Batch) { g(b).PowerAvgW = 1e300 })
	add("gpu invalid UTF-8 uuid", "uuid is not valid UTF-8", func(b *trainmeterv1.Batch) { g(b).Uuid = "GPU-\xff" })
	add("null gpu window", "is null", func(b *trainmeterv1.Batch) { b.GpuWindows = append(b.GpuWindows, nil) })
	add("run window empty id", "run_id is empty", func(b *trainmeterv1.Batch) { w(b).RunId = "" })
	add("run window NUL in id", "NUL", func(b *trainmeterv1.Batch) { w(b).RunId = "a\x00b" })
	add("run window invalid UTF-8 id", "not valid UTF-8", func(b *trainmeterv1.Batch) { w(b).RunId = "\xc3\x28" })
	add("run window id too long", "more than 256", func(b *trainmeterv1.Batch) { w(b).RunId = strings.Repeat("x", 257) })
	add("run window no phase", "phase must be", func(b *trainmeterv1.Batch) { w(b).Phase = trainmeterv1.Phase_PHASE_UNSPECIFIED })
	add("run window measured > tokens", "tokens_measured", func(b *trainmeterv1.Batch) { w(b).TokensMeasured = w(b).Tokens + 1 })
	add("run window 2^64-1 tokens", "more than 281474976710656 in one window", func(b *trainmeterv1.Batch) {
		w(b).Tokens, w(b).TokensMeasured = math.MaxUint64, 0
	})
	add("run window NaN loss", "last_loss is not finite", func(b *trainmeterv1.Batch) { w(b).LastLoss = proto.Float64(math.NaN()) })
	add("run window negative gpu_seconds", "gpu_seconds is negative", func(b *trainmeterv1.Batch) { w(b).GpuSeconds = -1 })
	add("run window ends before it starts", "end is before start", func(b *trainmeterv1.Batch) { w(b).End = tu.TS(-0.5) })
	add("run window in 2100", "after the batch window", func(b *trainmeterv1.Batch) {
		w(b).Start, w(b).End = timestamppb.New(time.Date(2100, 1, 1, 0, 0, 0, 0, time.UTC)), timestamppb.New(time.Date(2100, 1, 1, 0, 0, 1, 0, time.UTC))
	})
	add("event in 1970", "before the batch window", func(b *trainmeterv1.Batch) {
		b.RunEvents[1].GetEval().Time = timestamppb.New(time.Unix(0, 0))
	})
	add("empty event", "empty event", func(b *trainmeterv1.Batch) { b.RunEvents = append(b.RunEvents, &trainmeterv1.RunEvent{}) })
	add("eval Inf accuracy", "eval.accuracy is not finite", func(b *trainmeterv1.Batch) { b.RunEvents[1].GetEval().Accuracy = proto.Float64(math.Inf(1)) })
	// Found by FuzzAggregate in CI: the agent refuses a negative accuracy, a
	// collector took one from any other sender and reported it.
	add("eval negative accuracy", "eval.accuracy is negative", func(b *trainmeterv1.Batch) { b.RunEvents[1].GetEval().Accuracy = proto.Float64(-2.4e-240) })
	add("run_start NaN warmup", "run_start.warmup_s is not finite", func(b *trainmeterv1.Batch) { b.RunEvents[0].GetRunStart().WarmupS = math.NaN() })
	add("run_start notes 5 KB", "run_start.notes is 5000 bytes", func(b *trainmeterv1.Batch) {
		b.RunEvents[0].GetRunStart().Metadata.Notes = strings.Repeat("n", 5000)
	})
	add("run_start 300 labels", "300 labels", func(b *trainmeterv1.Batch) {
		l := map[string]string{}
		for i := 0; i < 300; i++ {
			l[strings.Repeat("k", i+1)] = "v"
		}
		b.RunEvents[0].GetRunStart().Labels = l
	})
	end := func(b *trainmeterv1.Batch, cause string) {
		b.RunEvents = append(b.RunEvents, &trainmeterv1.RunEvent{Event: &trainmeterv1.RunEvent_RunEnd{RunEnd: &trainmeterv1.RunEnd{
			RunId: "r", Time: tu.TS(0.75), EndStatus: "error", EndError: cause}}})
	}
	add("run_end error 2 KB", "run_end.end_error is 2000 bytes, more than 1024", func(b *trainmeterv1.Batch) { end(b, strings.Repeat("e", 2000)) })
	add("run_end error invalid UTF-8", "run_end.end_error is not valid UTF-8", func(b *trainmeterv1.Batch) { end(b, "OOM\xff") })
	add("host NaN cpu", "host.cpu_pct is not finite", func(b *trainmeterv1.Batch) { b.Host.CpuPct = math.NaN() })
	add("10001 gpu windows", "10001 gpu windows", func(b *trainmeterv1.Batch) {
		for len(b.GpuWindows) <= MaxGPUWindows {
			b.GpuWindows = append(b.GpuWindows, &trainmeterv1.GpuWindow{})
		}
	})
	return rows
}

func TestMalformedBatchesAreRejectedFieldByField(t *testing.T) {
	st := openStore(t)
	ing, conn := serve(t, st)
	a := tu.Connect(t, conn, "n1", "boot")
	rows := malformed(1)
	skipped := 0
	for _, r := range rows {
		err := ValidateBatch(r.b)
		if err == nil {
			t.Errorf("%s: ValidateBatch accepted it", r.name)
			continue
		}
		if !strings.Contains(err.Error(), r.want) {
			t.Errorf("%s: ValidateBatch: %v, want it to contain %q", r.name, err, r.want)
		}
		if strings.Contains(r.want, "UTF-8") || r.name == "null gpu window" {
			skipped++
			// Not sendable as such: Go's gRPC client refuses invalid UTF-8 in
			// proto3 strings, and a nil element goes on the wire as an empty
			// (valid) message. ValidateBatch still guards them.
			continue
		}
		reason := a.MustReject(r.b)
		if !strings.Contains(reason, r.want) {
			t.Errorf("%s: reason %q, want it to contain %q", r.name, reason, r.want)
		}
	}
	if runs, err := st.ListRuns(nil); err != nil || len(runs) != 0 {
		t.Fatalf("rejected batches stored %d runs (%v)", len(runs), err)
	}
	a.MustAck(tu.Batch(1, 0, []*trainmeterv1.RunWindow{tu.Window("r", 0, 10, 5)}, tu.Start("r", 0, "m")))
	s := ing.Stats()
	if s.Rejected != uint64(len(rows)-skipped) || s.Applied != 1 || s.SeqGaps != 0 {
		t.Errorf("stats %+v, want %d rejected, 1 applied, no gap", s, len(rows))
	}
}

func TestBatchTimeBounds(t *testing.T) {
	now := tu.T0.Add(100 * 24 * time.Hour)
	st := openStore(t)
	ing, conn := serve(t, st)
	ing.SetClock(clock.NewFake(now))
	a := tu.Connect(t, conn, "n1", "boot")
	seq := uint64(0)
	at := func(seq uint64, when time.Time) *trainmeterv1.Batch {
		sec := when.Sub(tu.T0).Seconds()
		return tu.Batch(seq, sec, []*trainmeterv1.RunWindow{tu.Window("r", sec, 1, 1)})
	}
	for _, c := range []struct {
		name string
		at   time.Time
		want string // "" = acked
	}{
		{"11 min ahead (agent clock skewed)", now.Add(11 * time.Minute), "ahead of the collector's clock (limit 10m0s)"},
		{"year 2200", time.Date(2200, 1, 1, 0, 0, 0, 0, time.UTC), "ahead of the collector's clock"},
		{"9 min ahead", now.Add(9 * time.Minute), ""},
		{"29 days old (spool replay after an outage)", now.Add(-29 * 24 * time.Hour), ""},
		{"31 days old", now.Add(-31 * 24 * time.Hour), "old, more than 720h0m0s"},
		{"1970", time.Unix(10, 0), "old, more than"},
	} {
		seq++
		b := at(seq, c.at)
		if c.want == "" {
			a.MustAck(b)
			continue
		}
		if reason := a.MustReject(b); !strings.Contains(reason, c.want) {
			t.Errorf("%s: reason %q, want %q", c.name, reason, c.want)
		}
	}
	if s := ing.Stats(); s.RejectedTime != 4 || s.Rejected != 4 || s.Applied != 2 {
		t.Errorf("stats %+v", s)
	}
}

func TestSequenceGapIsAcceptedCountedPerNode(t *testing.T) {
	st := openStore(t)
	ing, conn := serve(t, st)
	a := tu.Connect(t, conn, "n1", "boot-1")
	for _, seq := range []uint64{1, 2, 5, 3, 6, 10} { // 3..4 and 7..9 missing; 3 is a late resend
		a.MustAck(tu.Batch(seq, float64(seq), []*trainmeterv1.RunWindow{tu.Window("r", float64(seq), 100, 1)}, tu.Start("r", 0, "m")))
	}
	b := tu.Connect(t, conn, "n2", "boot-x")
	b.MustAck(tu.Batch(7, 1, nil)) // the first batch seen from a boot is never a gap
	b.MustAck(tu.Batch(8, 2, nil))
	s := ing.Stats()
	if s.SeqGaps != 2 || s.SeqMissing != 2+3 || s.SeqGapsPerNode["n1"] != 2 || s.SeqGapsPerNode["n2"] != 0 {
		t.Errorf("gaps %d missing %d per node %v, want 2, 5, n1:2", s.SeqGaps, s.SeqMissing, s.SeqGapsPerNode)
	}
	if s.Applied != 8 || s.ConnectedAgents != 2 || s.StoreWrites != 8 || s.StoreWriteP99Ms <= 0 {
		t.Errorf("stats %+v", s)
	}
	// Every acked batch's tokens are in: the gap loses only what never came.
	r, err := st.GetRun("r")
	if err != nil {
		t.Fatal(err)
	}
	if got := r.Report(aggregate.Pricing{}).TokensProcessed; got != 600 {
		t.Errorf("tokens %d, want 600", got)
	}
	// A new boot restarts the numbering: seq 1 is no gap.
	a2 := tu.Connect(t, conn, "n1", "boot-2")
	a2.MustAck(tu.Batch(1, 20, nil))
	a2.MustAck(tu.Batch(1, 20, nil)) // a duplicate
	if s := ing.Stats(); s.SeqGaps != 2 || s.Duplicate != 1 {
		t.Errorf("after a new boot: %+v", s)
	}
}

func TestOversizedMessageEndsTheStreamWithResourceExhausted(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	st := openStore(t)
	ing := New(st, quiet())
	ing.SetClock(tu.Clock())
	gs := grpc.NewServer(grpc.MaxRecvMsgSize(1 << 20))
	trainmeterv1.RegisterIngestServiceServer(gs, ing)
	go gs.Serve(lis)
	t.Cleanup(func() { ing.Close(); gs.GracefulStop() })
	conn := tu.Dial(t, lis.Addr().String())

	a := tu.Connect(t, conn, "n1", "boot")
	a.MustAck(tu.Batch(1, 0, nil))
	big := tu.Batch(2, 1, nil)
	for i := 0; i < 8000; i++ { // ~2 MiB of GPU windows
		big.GpuWindows = append(big.GpuWindows, &trainmeterv1.GpuWindow{Gpu: uint32(i), Uuid: strings.Repeat("u", 200)})
	}
	_, err = a.Send(big)
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("oversized batch: %v, want ResourceExhausted", err)
	}
	// Nothing of it was stored, and the collector serves the next stream.
	a2 := tu.Connect(t, conn, "n1", "boot")
	a2.MustAck(tu.Batch(3, 2, nil))
	if s := ing.Stats(); s.Applied != 2 {
		t.Errorf("stats %+v", s)
	}
}
