package store

import (
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/trainmeter/trainmeter/collector/internal/loadgen"
)

// BenchmarkApplyBatch stores 1 s batches of 8 GPUs (what an agent sends)
// from many concurrent streams, each its own node and run, durably (badger
// SyncWrites) like ingest does. gpu-samples/s counts GpuWindows stored.
func BenchmarkApplyBatch(b *testing.B) {
	for _, streams := range []int{1, 64, 1024} {
		b.Run(fmt.Sprintf("streams=%d", streams), func(b *testing.B) {
			s, err := Open(b.TempDir(), Options{Logger: quiet()})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			var next atomic.Int64
			now := time.Now()
			b.SetParallelism(max(1, streams/ncpu()))
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				id := next.Add(1)
				node, run := fmt.Sprintf("node-%d", id), fmt.Sprintf("run-%d", id)
				seq := uint64(0)
				for pb.Next() {
					seq++
					batch := loadgen.MakeBatch(seq, now.Add(time.Duration(seq)*time.Second), time.Second, run, 8, seq == 1)
					if _, err := s.ApplyBatch(node, "boot", batch); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)*8/b.Elapsed().Seconds(), "gpu-samples/s")
		})
	}
}

func ncpu() int { return runtime.GOMAXPROCS(0) }
