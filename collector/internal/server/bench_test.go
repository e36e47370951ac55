package server_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/trainmeter/trainmeter/collector/internal/loadgen"
	"github.com/trainmeter/trainmeter/collector/internal/report"
	"github.com/trainmeter/trainmeter/collector/internal/server"
	tu "github.com/trainmeter/trainmeter/collector/internal/testutil"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// BenchmarkExportCSV is `trainmeter export csv`: the ExportRuns stream from
// a real collector over loopback gRPC, written as CSV (what the CLI does),
// per export. runs=10000 are short runs (one window each); windows=300
// runs are live runs of 300 one-second windows, more than the open peak
// buckets a run keeps (aggregate.PeakHorizon): the largest aggregates for
// one node. Fewer of them, as seeding 10,000 takes minutes; the cost per
// run is the figure to scale.
func BenchmarkExportCSV(b *testing.B) {
	for _, c := range []struct{ runs, windows int }{{10000, 1}, {2000, 300}} {
		b.Run(fmt.Sprintf("runs=%d/windows=%d", c.runs, c.windows), func(b *testing.B) { benchExport(b, c.runs, c.windows) })
	}
}

func benchExport(b *testing.B, runs, windows int) {
	const streams = 10
	srv := server.New(server.Config{Listen: "127.0.0.1:0", DataDir: b.TempDir()}, quiet())
	if err := srv.Start(context.Background()); err != nil {
		b.Fatal(err)
	}
	defer srv.Shutdown(context.Background())
	conn := tu.Dial(b, srv.Addr().String())
	now := time.Now()
	var wg sync.WaitGroup
	for s := 0; s < streams; s++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a := tu.Connect(b, conn, fmt.Sprintf("node-%d", s), "boot")
			for i := 0; i < runs/streams; i++ {
				batch := loadgen.MakeBatch(uint64(i+1), now, time.Second, fmt.Sprintf("run-%05d", s*runs/streams+i), 8, true)
				w := batch.RunWindows[0]
				for j := 1; j < windows; j++ {
					wj := proto.Clone(w).(*trainmeterv1.RunWindow)
					wj.Start = timestamppb.New(w.GetStart().AsTime().Add(-time.Duration(j) * time.Second))
					wj.End = timestamppb.New(w.GetEnd().AsTime().Add(-time.Duration(j) * time.Second))
					batch.RunWindows = append(batch.RunWindows, wj)
				}
				a.MustAck(batch)
			}
		}()
	}
	wg.Wait()
	q := trainmeterv1.NewQueryServiceClient(conn)
	b.ResetTimer()
	for b.Loop() {
		stream, err := q.ExportRuns(context.Background(), &trainmeterv1.ExportRunsRequest{})
		if err != nil {
			b.Fatal(err)
		}
		var reports []*trainmeterv1.RunReport
		for {
			m, err := stream.Recv()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				b.Fatal(err)
			}
			reports = append(reports, m.GetRun())
		}
		if len(reports) != runs {
			b.Fatalf("exported %d runs, want %d", len(reports), runs)
		}
		if err := report.WriteCSV(io.Discard, reports); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N*runs), "µs/run")
}
