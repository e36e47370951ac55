package loadgen

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// Visibility measures how long a new run's first sample takes to show in
// the collector's run list (what `trainmeter runs` reads): from the moment
// its batch is sent until GetRun finds it, polling every 10 ms. It uses a
// stream and node of its own, named by id.
func Visibility(ctx context.Context, addr, id string) (time.Duration, error) {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	stream, err := trainmeterv1.NewIngestServiceClient(conn).Stream(ctx)
	if err != nil {
		return 0, err
	}
	defer func() { _ = stream.CloseSend() }()
	node, run := "probe-node-"+id, "probe-run-"+id
	if err := stream.Send(&trainmeterv1.StreamRequest{Msg: &trainmeterv1.StreamRequest_Hello{Hello: &trainmeterv1.Hello{
		Node: node, BootId: id, AgentVersion: "loadgen", GpuBackend: "sim",
		Gpus:      []*trainmeterv1.GpuInfo{{Index: 0, Name: "Sim H100", MemoryTotalMib: 81559, HasEnergyCounter: true}},
		StartedAt: timestamppb.Now(), LossWindowStart: true}}}); err != nil {
		return 0, err
	}
	q := trainmeterv1.NewQueryServiceClient(conn)
	t0 := time.Now()
	if err := stream.Send(&trainmeterv1.StreamRequest{Msg: &trainmeterv1.StreamRequest_Batch{Batch: MakeBatch(1, t0, time.Second, run, 1, true)}}); err != nil {
		return 0, err
	}
	for {
		_, err := q.GetRun(ctx, &trainmeterv1.GetRunRequest{RunId: run})
		if err == nil {
			return time.Since(t0), nil
		}
		if status.Code(err) != codes.NotFound {
			return 0, fmt.Errorf("GetRun: %w", err)
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("run %s not visible after %v", run, time.Since(t0))
		case <-time.After(10 * time.Millisecond):
		}
	}
}
