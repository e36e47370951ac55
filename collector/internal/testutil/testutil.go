// Package testutil has helpers for the collector's tests: a fake agent that
// speaks the ingest stream, and batch builders.
package testutil

import (
	"context"
	"fmt"
	"math"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"

	"github.com/trainmeter/trainmeter/pkg/clock"
)

// T0 is the time all test batches are relative to.
var T0 = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

// TS returns T0 + sec seconds.
func TS(sec float64) *timestamppb.Timestamp {
	return timestamppb.New(T0.Add(time.Duration(sec * float64(time.Second))))
}

// Dial connects to addr without TLS and closes the connection at test end.
func Dial(t testing.TB, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// Agent is a fake agent's ingest stream.
type Agent struct {
	t      testing.TB
	Stream grpc.BidiStreamingClient[trainmeterv1.StreamRequest, trainmeterv1.StreamResponse]
	cancel context.CancelFunc
}

// Connect opens a stream and sends Hello for node/boot.
func Connect(t testing.TB, conn *grpc.ClientConn, node, boot string) *Agent {
	t.Helper()
	return ConnectHello(t, conn, &trainmeterv1.Hello{
		Node: node, BootId: boot, AgentVersion: "test", GpuBackend: "sim",
		Gpus: []*trainmeterv1.GpuInfo{{Index: 0, Name: "Sim GPU", MemoryTotalMib: 81559, HasEnergyCounter: true}},
	})
}

// ConnectHello opens a stream and sends h.
func ConnectHello(t testing.TB, conn *grpc.ClientConn, h *trainmeterv1.Hello) *Agent {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	s, err := trainmeterv1.NewIngestServiceClient(conn).Stream(ctx)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	a := &Agent{t: t, Stream: s, cancel: cancel}
	t.Cleanup(a.Close)
	if err := s.Send(&trainmeterv1.StreamRequest{Msg: &trainmeterv1.StreamRequest_Hello{Hello: h}}); err != nil {
		t.Fatal(err)
	}
	return a
}

// Close ends the stream.
func (a *Agent) Close() {
	_ = a.Stream.CloseSend()
	a.cancel()
}

// Send sends a batch and returns the next response (ack, reject or advisory).
func (a *Agent) Send(b *trainmeterv1.Batch) (*trainmeterv1.StreamResponse, error) {
	if err := a.Stream.Send(&trainmeterv1.StreamRequest{Msg: &trainmeterv1.StreamRequest_Batch{Batch: b}}); err != nil {
		return nil, err
	}
	return a.Stream.Recv()
}

// MustAck sends b and fails the test unless it is acked.
func (a *Agent) MustAck(b *trainmeterv1.Batch) {
	a.t.Helper()
	resp, err := a.Send(b)
	if err != nil {
		a.t.Fatalf("batch %d: %v", b.GetSeq(), err)
	}
	if resp.GetAck().GetSeq() != b.GetSeq() || resp.GetAck() == nil {
		a.t.Fatalf("batch %d: want ack, got %v", b.GetSeq(), resp)
	}
}

// MustReject sends b and fails the test unless it is rejected; it returns the reason.
func (a *Agent) MustReject(b *trainmeterv1.Batch) string {
	a.t.Helper()
	resp, err := a.Send(b)
	if err != nil {
		a.t.Fatalf("batch %d: %v", b.GetSeq(), err)
	}
	if resp.GetReject() == nil || resp.GetReject().GetSeq() != b.GetSeq() {
		a.t.Fatalf("batch %d: want reject, got %v", b.GetSeq(), resp)
	}
	return resp.GetReject().GetReason()
}

// Window is one measured 1-GPU window of run over [sec, sec+1) with the
// given tokens and counter energy.
func Window(run string, sec float64, tokens uint64, energy float64) *trainmeterv1.RunWindow {
	return &trainmeterv1.RunWindow{
		RunId: run, Start: TS(sec), End: TS(sec + 1), Phase: trainmeterv1.Phase_PHASE_MEASURED,
		EnergyCounterJ: energy, CounterOk: true, EnergyIntegratedJ: energy * 0.99,
		PeakPowerW: energy * 1.2, VramPeakMib: 40000, VramSumMib: 39000 * 20, VramSamples: 20,
		GpuSeconds: 1, Tokens: tokens, TokensMeasured: tokens, Steps: 1, Gpus: []uint32{0},
		DataWaitS: 0.05, ComputeS: 0.9,
	}
}

// Batch wraps windows and events into batch seq over [sec, sec+1).
func Batch(seq uint64, sec float64, windows []*trainmeterv1.RunWindow, events ...*trainmeterv1.RunEvent) *trainmeterv1.Batch {
	return &trainmeterv1.Batch{
		Seq: seq, WindowStart: TS(sec), WindowEnd: TS(sec + 1), RunWindows: windows, RunEvents: events,
		GpuWindows: []*trainmeterv1.GpuWindow{{Gpu: 0, EnergyCounterJ: 100, CounterOk: true, PowerAvgW: 100, Samples: 20}},
		Host:       &trainmeterv1.HostWindow{CpuPct: 12, CpuCount: 16, MemoryUsedMib: 1000, MemoryTotalMib: 64000},
	}
}

// Start is a RunStart event.
func Start(run string, sec float64, model string) *trainmeterv1.RunEvent {
	return &trainmeterv1.RunEvent{Event: &trainmeterv1.RunEvent_RunStart{RunStart: &trainmeterv1.RunStart{
		RunId: run, Time: TS(sec), GpuName: "Sim GPU", Gpus: []uint32{0},
		Metadata: &trainmeterv1.RunMetadata{Model: model, Backend: "torch", Precision: "bf16", BatchSize: proto.Int64(8)},
	}}}
}

// End is a RunEnd event.
func End(run string, sec float64) *trainmeterv1.RunEvent {
	return &trainmeterv1.RunEvent{Event: &trainmeterv1.RunEvent_RunEnd{RunEnd: &trainmeterv1.RunEnd{RunId: run, Time: TS(sec)}}}
}

// Invalid returns malformed batches (with seq) and what each breaks.
func Invalid(seq uint64) map[string]*trainmeterv1.Batch {
	nan := Batch(seq, 0, []*trainmeterv1.RunWindow{Window("r", 0, 1, 1)})
	nan.RunWindows[0].EnergyCounterJ = math.NaN()
	empty := Batch(seq, 0, []*trainmeterv1.RunWindow{Window("", 0, 1, 1)})
	backwards := Batch(seq, 0, nil)
	backwards.WindowEnd = TS(-1)
	winBackwards := Batch(seq, 0, []*trainmeterv1.RunWindow{Window("r", 0, 1, 1)})
	winBackwards.RunWindows[0].End = TS(-1)
	zero := Batch(0, 0, nil)
	long := Batch(seq, 0, []*trainmeterv1.RunWindow{Window(fmt.Sprintf("%0300d", 1), 0, 1, 1)})
	neg := Batch(seq, 0, []*trainmeterv1.RunWindow{Window("r", 0, 1, -5)})
	inf := Batch(seq, 0, nil)
	inf.GpuWindows[0].PowerAvgW = math.Inf(1)
	negIdle := Batch(seq, 0, nil)
	negIdle.GpuWindows[0].IdleEnergyCounterJ = -1
	method := Batch(seq, 0, []*trainmeterv1.RunWindow{Window("r", 0, 1, 1)})
	method.RunWindows[0].ShareMethod = "by-guess"
	nanShare := Batch(seq, 0, []*trainmeterv1.RunWindow{Window("r", 0, 1, 1)})
	nanShare.RunWindows[0].GpuShares = []*trainmeterv1.GpuShare{{GpuSeconds: math.NaN()}}
	return map[string]*trainmeterv1.Batch{
		"negative idle energy": negIdle, "unknown share_method": method, "NaN GPU share": nanShare,
		"NaN energy": nan, "empty run_id": empty, "window_end < window_start": backwards,
		"run window end < start": winBackwards, "seq 0": zero, "run_id too long": long,
		"negative energy": neg, "infinite power": inf,
	}
}

// Now is a collector time for tests: one minute after T0, so the batches
// built here pass the ingest time bounds (ingest.CheckBatchTime).
func Now() time.Time { return T0.Add(time.Minute) }

// Clock is a fake collector clock standing at Now.
func Clock() *clock.Fake { return clock.NewFake(Now()) }
