package ingest_test

import (
	"io"
	"log/slog"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/trainmeter/trainmeter/collector/internal/ingest"
	"github.com/trainmeter/trainmeter/collector/internal/loadgen"
	"github.com/trainmeter/trainmeter/collector/internal/store"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// Raw samples (agent --raw-samples) are checked column by column and stored
// as they came, one record per batch.
func TestRawSamplesValidatedAndStored(t *testing.T) {
	now := time.Now()
	good := loadgen.MakeBatch(1, now, time.Second, "r", 8, true)
	loadgen.AddRawSamples(good, 20)
	if err := ingest.ValidateBatch(good); err != nil {
		t.Fatalf("valid raw samples rejected: %v", err)
	}

	bad := map[string]func(b *trainmeterv1.Batch){
		"power_w values":      func(b *trainmeterv1.Batch) { b.RawSamples[0].PowerW = b.RawSamples[0].PowerW[1:] },
		"memory_used_mib":     func(b *trainmeterv1.Batch) { b.RawSamples[1].MemoryUsedMib = b.RawSamples[1].MemoryUsedMib[:3] },
		"does not increase":   func(b *trainmeterv1.Batch) { b.RawSamples[2].TUnixNs[5] = b.RawSamples[2].TUnixNs[4] },
		"outside the batch":   func(b *trainmeterv1.Batch) { b.RawSamples[0].TUnixNs[19] = uint64(now.Add(time.Hour).UnixNano()) },
		"not a physical":      func(b *trainmeterv1.Batch) { b.RawSamples[3].PowerW[0] = float32(math.NaN()) },
		"power_w[2] is not a": func(b *trainmeterv1.Batch) { b.RawSamples[3].PowerW[2] = -1 },
		"is null":             func(b *trainmeterv1.Batch) { b.RawSamples[4] = nil },
	}
	for want, mutate := range bad {
		b := loadgen.MakeBatch(1, now, time.Second, "r", 8, true)
		loadgen.AddRawSamples(b, 20)
		mutate(b)
		err := ingest.ValidateBatch(b)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: got %v", want, err)
		}
	}

	st, err := store.Open(t.TempDir(), store.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if _, err := st.ApplyBatch("n1", "b1", good); err != nil {
		t.Fatal(err)
	}
	got, err := st.RawSamples("n1")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || len(got[0].GetRawSamples()) != 8 || len(got[0].GetRawSamples()[7].GetTUnixNs()) != 20 ||
		got[0].GetRawSamples()[7].GetPowerW()[3] != good.RawSamples[7].PowerW[3] {
		t.Fatalf("stored raw samples: %v", got)
	}
}
