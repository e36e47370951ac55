package store

import (
	"testing"
	"time"

	"github.com/dgraph-io/badger/v4"

	"github.com/trainmeter/trainmeter/collector/internal/aggregate"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// keysByPrefix counts the store's keys under each of prefixes.
func keysByPrefix(t *testing.T, s *Store, prefixes ...string) map[string]int {
	t.Helper()
	out := map[string]int{}
	err := s.db.View(func(txn *badger.Txn) error {
		for _, p := range prefixes {
			it := txn.NewIterator(badger.IteratorOptions{Prefix: []byte(p)})
			for it.Rewind(); it.Valid(); it.Next() {
				out[p]++
			}
			it.Close()
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// applyWant applies b from sender and fails unless its duplicate verdict is dup.
func applyWant(t *testing.T, s *Store, sender Sender, b *trainmeterv1.Batch, dup bool) {
	t.Helper()
	a, err := s.ApplyBatchResult(sender, b)
	if err != nil || a.Duplicate != dup {
		t.Fatalf("%s seq %d at %v: duplicate=%v err=%v, want duplicate=%v", sender.Boot, b.GetSeq(),
			b.GetWindowStart().AsTime().Sub(t0), a.Duplicate, err, dup)
	}
}

func tokens(t *testing.T, s *Store, run string) uint64 {
	t.Helper()
	st, err := s.GetRun(run)
	if err != nil {
		t.Fatal(err)
	}
	return st.Report(aggregate.Pricing{}).GetTokensProcessed()
}

// A batch writes three keys (GPU/host record, run window, aggregate), not a
// fourth dedup mark, and is still recognised when re-sent: with the node's
// entry warm, evicted from the cache, and after a reopen (a collector
// restart, the agent re-sending everything it has no ack for).
func TestBatchWritesThreeKeysAndResendsAreStillDuplicates(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	n := Sender{Node: "n", Boot: "b1"}
	for seq := uint64(1); seq <= 10; seq++ {
		applyWant(t, s, n, batch(seq, "r", int(seq), 10, 1, runStart("r", 0)), false)
	}
	got := keysByPrefix(t, s, "b/", "r/", "w/", "a/")
	if got["b/"] != 0 || got["r/"] != 10 || got["w/"] != 10 || got["a/"] != 1 {
		t.Errorf("keys after 10 batches: %v, want no b/, 10 r/, 10 w/, 1 a/", got)
	}
	applyWant(t, s, n, batch(4, "r", 4, 10, 1), true)
	s.nodes.forget("n") // as if evicted from the node cache
	applyWant(t, s, n, batch(7, "r", 7, 10, 1), true)
	applyWant(t, s, n, batch(10, "r", 10, 10, 1), true)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = open(t, dir)
	defer s.Close()
	// The re-send after a restart starts in the middle: 6 was applied but
	// not acked, so 6..10 come again, then the first new one.
	for seq := uint64(6); seq <= 10; seq++ {
		applyWant(t, s, n, batch(seq, "r", int(seq), 10, 1), true)
	}
	applyWant(t, s, n, batch(11, "r", 11, 10, 1), false)
	applyWant(t, s, n, batch(11, "r", 11, 10, 1), true)
	if got := tokens(t, s, "r"); got != 11*10 {
		t.Errorf("tokens %d, want %d: each of the 11 batches once", got, 11*10)
	}
	if got := keysByPrefix(t, s, "b/")["b/"]; got != 0 {
		t.Errorf("%d b/ marks, want 0", got)
	}
}

// Where the r/ record may expire before a mark would, and where a batch has
// no r/ record, the b/ mark is still written.
func TestDedupMarkStillWrittenWhereTheRecordCannotStandIn(t *testing.T) {
	short, err := Open(t.TempDir(), Options{Logger: quiet(), RawRetention: time.Hour, DedupRetention: 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer short.Close()
	for seq := uint64(1); seq <= 3; seq++ {
		applyWant(t, short, Sender{Node: "n", Boot: "b"}, batch(seq, "r", int(seq), 10, 1), false)
	}
	if got := keysByPrefix(t, short, "b/")["b/"]; got != 3 {
		t.Errorf("raw retention shorter than dedup retention: %d b/ marks, want 3", got)
	}

	long, err := Open(t.TempDir(), Options{Logger: quiet(), RawRetention: 48 * time.Hour, DedupRetention: 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer long.Close()
	applyWant(t, long, Sender{Node: "n", Boot: "b"}, batch(1, "r", 1, 10, 1), false)
	if got := keysByPrefix(t, long, "b/")["b/"]; got != 0 {
		t.Errorf("raw retention longer than dedup retention: %d b/ marks, want 0", got)
	}

	s := open(t, t.TempDir())
	defer s.Close()
	bare := batch(1, "r", 1, 10, 1)
	bare.GpuWindows, bare.Host = nil, nil
	applyWant(t, s, Sender{Node: "n", Boot: "b"}, bare, false)
	got := keysByPrefix(t, s, "b/", "r/")
	if got["b/"] != 1 || got["r/"] != 0 {
		t.Errorf("keys: %v, want 1 b/ (the batch without GPU/host windows) and no r/", got)
	}
	applyWant(t, s, Sender{Node: "n", Boot: "b"}, bare, true)
}

// An agent restarted with a new boot numbers from 1 again: its batches are
// new, and the old boot's re-sends are still duplicates, before and after a
// collector restart.
func TestNewBootIsNotTakenForDuplicatesAndOldBootResendsStillAre(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	b1, b2 := Sender{Node: "n", Boot: "b1"}, Sender{Node: "n", Boot: "b2"}
	for seq := uint64(1); seq <= 5; seq++ {
		applyWant(t, s, b1, batch(seq, "r", int(seq), 10, 1, runStart("r", 0)), false)
	}
	for seq := uint64(1); seq <= 3; seq++ {
		applyWant(t, s, b2, batch(seq, "r", 100+int(seq), 10, 1), false)
	}
	applyWant(t, s, b1, batch(4, "r", 4, 10, 1), true)
	applyWant(t, s, b2, batch(4, "r", 104, 10, 1), false)
	applyWant(t, s, b1, batch(5, "r", 5, 10, 1), true)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = open(t, dir)
	defer s.Close()
	for seq := uint64(1); seq <= 5; seq++ {
		applyWant(t, s, b1, batch(seq, "r", int(seq), 10, 1), true)
	}
	for seq := uint64(1); seq <= 4; seq++ {
		applyWant(t, s, b2, batch(seq, "r", 100+int(seq), 10, 1), true)
	}
	applyWant(t, s, b1, batch(6, "r", 6, 10, 1), false) // a straggler of the old boot
	applyWant(t, s, b2, batch(5, "r", 105, 10, 1), false)
	if got := tokens(t, s, "r"); got != 11*10 {
		t.Errorf("tokens %d, want %d", got, 11*10)
	}
}

// Nothing assumes window starts grow with seq: after a clock stepped back
// within a boot, a cold entry made by a later-starting batch still finds
// the earlier-starting batches with higher seqs.
func TestResendAfterTheClockSteppedBackIsADuplicate(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	n := Sender{Node: "n", Boot: "b"}
	starts := map[uint64]int{1: 100, 2: 101, 3: 102, 4: 50, 5: 51}
	for seq := uint64(1); seq <= 5; seq++ {
		applyWant(t, s, n, batch(seq, "r", starts[seq], 10, 1, runStart("r", 0)), false)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = open(t, dir)
	defer s.Close()
	for seq := uint64(3); seq <= 5; seq++ { // 3 (start 102) makes the entry
		applyWant(t, s, n, batch(seq, "r", starts[seq], 10, 1), true)
	}
	applyWant(t, s, n, batch(6, "r", 52, 10, 1), false)
	if got := tokens(t, s, "r"); got != 6*10 {
		t.Errorf("tokens %d, want %d", got, 6*10)
	}
}

// Two boots' batches with the same start and seq share an r/ key: the
// second replaces the first's record, which keeps its deduplication as a
// b/ mark.
func TestRecordReplacedByAnotherBootKeepsItsBatchADuplicate(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	b1, b2 := Sender{Node: "n", Boot: "b1"}, Sender{Node: "n", Boot: "b2"}
	applyWant(t, s, b1, batch(1, "r", 10, 10, 1, runStart("r", 0)), false)
	applyWant(t, s, b1, batch(2, "r", 11, 10, 1), false)
	applyWant(t, s, b2, batch(1, "r", 10, 10, 1), false) // the boot changes: a scan that sees b1's records
	applyWant(t, s, b1, batch(1, "r", 10, 10, 1), true)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = open(t, dir)
	defer s.Close()
	applyWant(t, s, b2, batch(2, "r", 11, 10, 1), false) // cold b2 entry, above its maxSeq
	applyWant(t, s, b1, batch(2, "r", 11, 10, 1), true)
	applyWant(t, s, b1, batch(1, "r", 10, 10, 1), true)
	applyWant(t, s, b2, batch(1, "r", 10, 10, 1), true)
	applyWant(t, s, b2, batch(2, "r", 11, 10, 1), true)
	if got := tokens(t, s, "r"); got != 4*10 {
		t.Errorf("tokens %d, want %d", got, 4*10)
	}
}

// Many r/ records past the first re-sent batch after a reopen: each re-send
// is found, and the next batch is new.
func TestColdEntryWithMoreRecordsThanOneScanReads(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	n := Sender{Node: "n", Boot: "b"}
	last := uint64(276)
	for seq := uint64(1); seq <= last; seq++ {
		applyWant(t, s, n, batch(seq, "r", int(seq), 10, 1, runStart("r", 0)), false)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = open(t, dir)
	defer s.Close()
	applyWant(t, s, n, batch(1, "r", 1, 10, 1), true)
	applyWant(t, s, n, batch(last-1, "r", int(last-1), 10, 1), true)
	applyWant(t, s, n, batch(last, "r", int(last), 10, 1), true)
	applyWant(t, s, n, batch(last+1, "r", int(last+1), 10, 1), false)
	if got := tokens(t, s, "r"); got != (last+1)*10 {
		t.Errorf("tokens %d, want %d", got, (last+1)*10)
	}
}

// A batch that sets stored_boot_id (agents never do) gets the sender's
// boot in its record all the same.
func TestReceivedStoredBootIDIsIgnored(t *testing.T) {
	s := open(t, t.TempDir())
	defer s.Close()
	b := batch(1, "r", 1, 10, 1)
	b.StoredBootId = "forged"
	applyWant(t, s, Sender{Node: "n", Boot: "b"}, b, false)
	recs, err := s.NodeGPUWindows("n", t0, t0.Add(time.Minute))
	if err != nil || len(recs) != 1 || recs[0].GetStoredBootId() != "b" {
		t.Fatalf("records %v, %v: want one with stored_boot_id b", recs, err)
	}
	applyWant(t, s, Sender{Node: "n", Boot: "b"}, batch(1, "r", 1, 10, 1), true)
	applyWant(t, s, Sender{Node: "n", Boot: "forged"}, batch(2, "r", 2, 10, 1), false)
}

// An in-doubt loss record (seq set) is dropped when its batch was applied
// and counted when it was not: found by its r/ record, or by its b/ mark
// where the store keeps marks (raw records expiring before marks would).
func TestInDoubtLossFoundByItsRecordOrItsMark(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    Options
	}{
		{"record", Options{}},
		{"mark", Options{RawRetention: time.Hour, DedupRetention: 24 * time.Hour}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			sender := Sender{Node: "n", Boot: "b"}
			s := openWith(t, dir, tc.o)
			applyWant(t, s, sender, batch(1, "r", 1, 10, 1, runStart("r", 1)), false)
			applyWant(t, s, sender, batch(2, "r", 2, 10, 1), false)
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			s = openWith(t, dir, tc.o)
			defer s.Close()
			loss := func(seq uint64, sec int) *trainmeterv1.DataLoss {
				return &trainmeterv1.DataLoss{RunId: "r", Batches: 1, Tokens: 10, EnergyJ: 1, GpuSeconds: 1, Reason: "spool full", Seq: seq, WindowStart: ts(sec)}
			}
			b := batch(5, "r", 5, 10, 1)
			b.Losses = []*trainmeterv1.DataLoss{loss(2, 2), loss(3, 3)} // 2 applied, 3 not
			applyWant(t, s, sender, b, false)
			st, err := s.GetRun("r")
			if err != nil {
				t.Fatal(err)
			}
			if r := st.Report(aggregate.Pricing{}); r.LostBatches != 1 || r.LostTokens != 10 || !r.Incomplete {
				t.Errorf("lost batches %d tokens %d incomplete %v, want 1 batch (seq 3), 10 tokens", r.LostBatches, r.LostTokens, r.Incomplete)
			}
		})
	}
}
