package store

import (
	"errors"
	"testing"
	"time"

	"github.com/trainmeter/trainmeter/collector/internal/loadgen"

	"github.com/trainmeter/trainmeter/pkg/clock"
)

// With a raw retention, raw records expire (badger TTL; they vanish from
// reads at once and from disk at compaction) while the run aggregate stays;
// the dedup mark outlives them.
func TestRawRetentionExpiresRawRecordsNotAggregates(t *testing.T) {
	// Written a minute ago on the store's clock: a second's raw retention
	// is over, an hour's dedup retention is not. (Badger compares expiry
	// with the wall clock when reading.)
	written := time.Now().Add(-time.Minute)
	s, err := Open(t.TempDir(), Options{Logger: quiet(), RawRetention: time.Second, DedupRetention: time.Hour,
		Clock: clock.NewFake(written)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	b := loadgen.MakeBatch(1, time.Now(), time.Second, "r", 8, true)
	loadgen.AddRawSamples(b, 20)
	if _, err := s.ApplyBatch("n", "boot", b); err != nil {
		t.Fatal(err)
	}
	raw, err := s.RawSamples("n")
	if err != nil || len(raw) != 0 {
		t.Errorf("raw samples after expiry: %d, %v", len(raw), err)
	}
	ws, err := s.RunWindows("r")
	if err != nil || len(ws) != 0 {
		t.Errorf("run windows after expiry: %d, %v", len(ws), err)
	}
	if st, err := s.GetRun("r"); err != nil || st.Tokens != 65536 {
		t.Errorf("aggregate after expiry: %v, %v", st, err)
	}
	if dup, err := s.ApplyBatch("n", "boot", b); err != nil || !dup {
		t.Errorf("replay after the raw records expired: dup=%v err=%v, want a duplicate", dup, err)
	}
	// Written now, the same raw records are there.
	fresh, err := Open(t.TempDir(), Options{Logger: quiet(), RawRetention: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Close()
	if _, err := fresh.ApplyBatch("n", "boot", b); err != nil {
		t.Fatal(err)
	}
	if raw, err := fresh.RawSamples("n"); err != nil || len(raw) != 1 {
		t.Errorf("raw samples within their retention: %d, %v", len(raw), err)
	}
	if _, err := Open(t.TempDir(), Options{RawRetention: -time.Second}); err == nil || errors.Is(err, ErrNotFound) {
		t.Errorf("negative retention: %v", err)
	}
}
