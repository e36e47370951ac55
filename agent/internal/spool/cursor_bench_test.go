package spool

import (
	"fmt"
	"testing"
)

// BenchmarkAppendAckPerCollector: the spool's cost per batch with one
// collector and with a pair (each batch written once, acked by each).
func BenchmarkAppendAckPerCollector(b *testing.B) {
	for _, names := range [][]string{{"a:1"}, {"a:1", "b:1"}} {
		b.Run(fmt.Sprintf("collectors=%d", len(names)), func(b *testing.B) {
			s, err := OpenWith(b.TempDir(), 0, Options{Collectors: names})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				bt := batch(i+1, "r1", "r2")
				if err := s.Append(bt); err != nil {
					b.Fatal(err)
				}
				for c := range names {
					s.Cursor(c).Ack(bt.Seq)
				}
			}
		})
	}
}
