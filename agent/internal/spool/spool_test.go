package spool

import (
	"fmt"
	"log/slog"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type logBuf struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func testLogger(t *testing.T) (*slog.Logger, *logBuf) {
	lb := &logBuf{}
	return slog.New(slog.NewTextHandler(lb, &slog.HandlerOptions{Level: slog.LevelDebug})), lb
}

func open(t *testing.T, dir string, maxBytes, segBytes int64) *Spool {
	t.Helper()
	lg, _ := testLogger(t)
	s, err := OpenWith(dir, maxBytes, Options{Logger: lg, SegmentBytes: segBytes})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

var t0 = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

// batch is a batch with one window of run for i tokens and i J.
func batch(i int, runs ...string) *trainmeterv1.Batch {
	ws := t0.Add(time.Duration(i) * time.Second)
	b := &trainmeterv1.Batch{Seq: 999, WindowStart: timestamppb.New(ws), WindowEnd: timestamppb.New(ws.Add(time.Second))}
	for _, r := range runs {
		b.RunWindows = append(b.RunWindows, &trainmeterv1.RunWindow{RunId: r, Start: b.WindowStart, End: b.WindowEnd,
			Phase: trainmeterv1.Phase_PHASE_MEASURED, Tokens: uint64(i), EnergyCounterJ: float64(i), CounterOk: true, GpuSeconds: 2})
	}
	return b
}

// abandon releases the spool's files the way a killed process would: no
// fsync, no state write. The tests use it to simulate kill -9.
func (s *Spool) abandon() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	s.dropTail()
	if s.active != nil {
		_ = s.active.Close()
		s.active = nil
	}
	if s.ackf != nil {
		_ = s.ackf.Close()
		s.ackf = nil
	}
	unlockDir(s.lock)
}

func mustAppend(t *testing.T, s *Spool, b *trainmeterv1.Batch) {
	t.Helper()
	if err := s.Append(b); err != nil {
		t.Fatal(err)
	}
}

func unacked(t *testing.T, s *Spool) []*trainmeterv1.Batch {
	t.Helper()
	bs, err := s.Cursor(0).ReadAfter(0, math.MaxInt)
	if err != nil {
		t.Fatal(err)
	}
	return bs
}

func seqs(bs []*trainmeterv1.Batch) []uint64 {
	var out []uint64
	for _, b := range bs {
		out = append(out, b.Seq)
	}
	return out
}

func TestRoundtripAssignsSeqsAndReadsBack(t *testing.T) {
	s := open(t, t.TempDir(), 0, 0)
	defer s.Close()
	var want []*trainmeterv1.Batch
	for i := 1; i <= 10; i++ {
		b := batch(i, "r1", "r2")
		mustAppend(t, s, b)
		if b.Seq != uint64(i) {
			t.Fatalf("append %d got seq %d", i, b.Seq)
		}
		want = append(want, proto.Clone(b).(*trainmeterv1.Batch))
	}
	got := unacked(t, s)
	if len(got) != 10 {
		t.Fatalf("unacked %d, want 10", len(got))
	}
	for i := range got {
		if !proto.Equal(got[i], want[i]) {
			t.Errorf("batch %d read back differs:\n%v\n%v", i, got[i], want[i])
		}
	}
	after, _ := s.Cursor(0).ReadAfter(7, 2)
	if fmt.Sprint(seqs(after)) != "[8 9]" {
		t.Errorf("ReadAfter(7, 2) = %v", seqs(after))
	}
	if st := s.Stats(); st.Appended != 10 || st.Unacked != 10 || st.Bytes != s.Bytes() || st.BootID == "" || st.NextSeq != 11 {
		t.Errorf("stats %+v", st)
	}
}

func segFiles(t *testing.T, dir string) []string {
	t.Helper()
	m, _ := filepath.Glob(filepath.Join(dir, segPrefix+"*"))
	sort.Strings(m)
	return m
}

func TestAckRemovesWholeSegmentsAndSurvivesReopen(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, 1<<20, 1<<10)
	for i := 1; i <= 100; i++ {
		mustAppend(t, s, batch(i, "r"))
	}
	nseg := len(segFiles(t, dir))
	if nseg < 5 {
		t.Fatalf("only %d segments; the test wants several", nseg)
	}
	full := s.Bytes()
	for seq := uint64(1); seq <= 90; seq++ {
		s.Cursor(0).Ack(seq)
	}
	if n := len(segFiles(t, dir)); n >= nseg || n > 3 {
		t.Errorf("%d segments after acking 90 of 100 (had %d)", n, nseg)
	}
	if s.Bytes() >= full/2 {
		t.Errorf("bytes %d, was %d", s.Bytes(), full)
	}
	if got := seqs(unacked(t, s)); len(got) != 10 || got[0] != 91 {
		t.Errorf("unacked %v", got)
	}
	s.Cursor(0).Ack(5) // already acked and gone: ignored
	if st := s.Stats(); st.Acked != 90 {
		t.Errorf("acked %d", st.Acked)
	}
	boot := s.BootID()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = open(t, dir, 1<<20, 1<<10)
	defer s.Close()
	if got := seqs(unacked(t, s)); len(got) != 10 || got[0] != 91 || got[9] != 100 {
		t.Errorf("after reopen unacked %v", got)
	}
	if s.BootID() != boot {
		t.Errorf("boot id changed across a clean restart")
	}
	for seq := uint64(91); seq <= 100; seq++ {
		s.Cursor(0).Ack(seq)
	}
	b := batch(101, "r")
	mustAppend(t, s, b)
	if b.Seq != 101 {
		t.Errorf("seq after everything acked and reopened: %d, want 101", b.Seq)
	}
}

// lossTotals adds up what the spool still holds and what it reports lost.
type totals struct{ heldTokens, lostTokens, heldBatches, lostBatches uint64 }

func account(t *testing.T, s *Spool) totals {
	t.Helper()
	var tt totals
	for _, b := range unacked(t, s) {
		if len(b.RunWindows) > 0 {
			tt.heldBatches++
		}
		for _, w := range b.RunWindows {
			tt.heldTokens += w.Tokens
		}
		for _, l := range b.Losses {
			tt.lostTokens += l.Tokens
			tt.lostBatches += l.Batches
		}
	}
	s.mu.Lock()
	for _, l := range slices.Concat(slices.Collect(maps.Values(s.losses)), s.seqLosses) {
		if l.RunId == "" {
			continue // the node's record: its batches are every dropped one
		}
		tt.lostTokens += l.Tokens
		tt.lostBatches += l.Batches
	}
	s.mu.Unlock()
	return tt
}

func TestFullSpoolDropsOldestWithinBoundAndAccountsExactly(t *testing.T) {
	s := open(t, t.TempDir(), 32<<10, 4<<10)
	defer s.Close()
	const n = 600
	var sent uint64
	for i := 1; i <= n; i++ {
		mustAppend(t, s, batch(i, "r"))
		sent += uint64(i)
		if s.Bytes() > 32<<10 {
			t.Fatalf("append %d: %d bytes, bound %d", i, s.Bytes(), 32<<10)
		}
	}
	st := s.Stats()
	held := unacked(t, s)
	if st.Dropped == 0 || st.Dropped+uint64(len(held)) != n {
		t.Fatalf("dropped %d + held %d != appended %d", st.Dropped, len(held), n)
	}
	// Newest kept: the held seqs are the last ones, contiguous.
	if held[len(held)-1].Seq != n || held[0].Seq != uint64(n-len(held)+1) {
		t.Errorf("held seqs %d..%d, want the newest", held[0].Seq, held[len(held)-1].Seq)
	}
	tt := account(t, s)
	if tt.heldTokens+tt.lostTokens != sent {
		t.Errorf("held %d + lost %d tokens != sent %d", tt.heldTokens, tt.lostTokens, sent)
	}
	if tt.lostBatches != st.Dropped || tt.heldBatches != uint64(len(held)) {
		t.Errorf("lost batches %d (dropped %d), held %d", tt.lostBatches, st.Dropped, tt.heldBatches)
	}
	// The loss report rides on the newest batches, never in-doubt (nothing was sent).
	for _, b := range held {
		for _, l := range b.Losses {
			if l.Seq != 0 || l.Reason != "spool full" || l.RunId != "r" {
				t.Errorf("loss record %v", l)
			}
			if math.Abs(l.EnergyJ-float64(l.Tokens)) > 1e-6 || l.GpuSeconds != 2*float64(l.Batches) {
				t.Errorf("loss energy/gpu-seconds do not match the dropped windows: %v", l)
			}
		}
	}
}

func TestDroppedSentBatchIsReportedInDoubtWithItsSeq(t *testing.T) {
	s := open(t, t.TempDir(), 16<<10, 4<<10)
	defer s.Close()
	mustAppend(t, s, batch(1, "r"))
	s.Cursor(0).MarkSent(1)
	ev := &trainmeterv1.RunEvent{Event: &trainmeterv1.RunEvent_RunStart{RunStart: &trainmeterv1.RunStart{RunId: "r", Time: timestamppb.New(t0)}}}
	b2 := batch(2, "r")
	b2.RunEvents = []*trainmeterv1.RunEvent{ev}
	mustAppend(t, s, b2)
	for i := 3; s.Stats().Dropped < 2; i++ {
		mustAppend(t, s, batch(i, "r"))
	}
	var doubt, certain []*trainmeterv1.DataLoss
	carried := false
	for _, b := range unacked(t, s) {
		for _, l := range b.Losses {
			if l.Seq != 0 {
				doubt = append(doubt, l)
			} else {
				certain = append(certain, l)
			}
		}
		for _, e := range b.RunEvents {
			if proto.Equal(e, ev) {
				carried = true
			}
		}
	}
	if len(doubt) != 1 || doubt[0].Seq != 1 || doubt[0].Tokens != 1 {
		t.Errorf("in-doubt loss records %v, want one for seq 1", doubt)
	} else if !proto.Equal(doubt[0].WindowStart, batch(1, "r").WindowStart) {
		// The collector finds the batch by (window_start, seq).
		t.Errorf("in-doubt loss record's window_start %v, want batch 1's %v", doubt[0].WindowStart, batch(1, "r").WindowStart)
	}
	if len(certain) == 0 || certain[0].Batches < 1 {
		t.Errorf("certain loss records %v", certain)
	}
	if !carried {
		t.Errorf("the run_start of a dropped batch was not carried to a kept one")
	}
}

func corruptLastSegment(t *testing.T, dir string, f func([]byte) []byte) {
	t.Helper()
	segs := segFiles(t, dir)
	p := segs[len(segs)-1]
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, f(b), 0o640); err != nil {
		t.Fatal(err)
	}
}

func TestTornOrCorruptTailIsTruncatedAndCounted(t *testing.T) {
	cases := []struct {
		name     string
		mangle   func([]byte) []byte
		wantKept int
	}{
		{"truncated mid-record", func(b []byte) []byte { return b[:len(b)-7] }, 4},
		{"short header", func(b []byte) []byte { return append(b, 1, 2, 3) }, 5},
		{"garbage appended", func(b []byte) []byte { return append(b, []byte(strings.Repeat("\xde\xad\xbe\xef", 100))...) }, 5},
		{"bad CRC in the last record", func(b []byte) []byte { b[len(b)-3] ^= 0xff; return b }, 4},
		{"huge length", func(b []byte) []byte {
			return append(b, 0xff, 0xff, 0xff, 0x7f, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1)
		}, 5},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			s := open(t, dir, 0, 0)
			for i := 1; i <= 5; i++ {
				mustAppend(t, s, batch(i, "r"))
			}
			boot := s.BootID()
			s.abandon()
			corruptLastSegment(t, dir, tc.mangle)
			lg, logs := testLogger(t)
			s, err := OpenWith(dir, 0, Options{Logger: lg})
			if err != nil {
				t.Fatalf("open after corruption: %v", err)
			}
			defer s.Close()
			if got := unacked(t, s); len(got) != tc.wantKept {
				t.Errorf("kept %v, want %d records", seqs(got), tc.wantKept)
			}
			st := s.Stats()
			if st.CorruptRecords != 1 || st.CorruptBytes == 0 {
				t.Errorf("stats %+v", st)
			}
			if !strings.Contains(logs.String(), "bytes_discarded=") {
				t.Errorf("nothing logged about the discarded bytes:\n%s", logs)
			}
			if s.BootID() != boot {
				t.Errorf("boot id changed")
			}
			b := batch(6, "r")
			mustAppend(t, s, b)
			if b.Seq <= uint64(tc.wantKept) {
				t.Errorf("next seq %d reuses a kept one", b.Seq)
			}
			if got := unacked(t, s); len(got) != tc.wantKept+1 {
				t.Errorf("after append: %v", seqs(got))
			}
		})
	}
}

func TestCorruptSegmentHeaderIsDiscarded(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, 0, 0)
	mustAppend(t, s, batch(1, "r"))
	s.abandon()
	corruptLastSegment(t, dir, func(b []byte) []byte { b[0] = 'X'; return b })
	s = open(t, dir, 0, 0)
	defer s.Close()
	if got := unacked(t, s); len(got) != 0 {
		t.Errorf("kept %v", seqs(got))
	}
	if st := s.Stats(); st.CorruptBytes == 0 {
		t.Errorf("stats %+v", st)
	}
	b := batch(2, "r")
	mustAppend(t, s, b)
	if b.Seq <= 1 {
		t.Errorf("seq %d reuses a seq that may have been sent", b.Seq)
	}
}

func TestCorruptStateFile(t *testing.T) {
	t.Run("segments left: boot id recovered from them", func(t *testing.T) {
		dir := t.TempDir()
		s := open(t, dir, 0, 0)
		for i := 1; i <= 3; i++ {
			mustAppend(t, s, batch(i, "r"))
		}
		boot := s.BootID()
		s.abandon()
		if err := os.WriteFile(filepath.Join(dir, stateName), []byte("{not json"), 0o640); err != nil {
			t.Fatal(err)
		}
		lg, logs := testLogger(t)
		s, err := OpenWith(dir, 0, Options{Logger: lg})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if !s.Stats().StateCorrupt || !strings.Contains(logs.String(), "state file is corrupt") {
			t.Errorf("corrupt state not reported: %+v\n%s", s.Stats(), logs)
		}
		if s.BootID() != boot {
			t.Errorf("boot id %q, want %q recovered from the segment", s.BootID(), boot)
		}
		b := batch(4, "r")
		mustAppend(t, s, b)
		if b.Seq != 4 || len(unacked(t, s)) != 4 {
			t.Errorf("seq %d, unacked %v", b.Seq, seqs(unacked(t, s)))
		}
	})
	t.Run("nothing left: new boot id", func(t *testing.T) {
		dir := t.TempDir()
		s := open(t, dir, 0, 0)
		boot := s.BootID()
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		// Flip one byte: the checksum catches it.
		p := filepath.Join(dir, stateName)
		b, _ := os.ReadFile(p)
		b[5] ^= 0x01
		_ = os.WriteFile(p, b, 0o640)
		lg, logs := testLogger(t)
		s, err := OpenWith(dir, 0, Options{Logger: lg})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if s.BootID() == boot || s.BootID() == "" || !s.Stats().StateCorrupt {
			t.Errorf("boot %q (was %q), stats %+v", s.BootID(), boot, s.Stats())
		}
		if !strings.Contains(logs.String(), "started a new boot id") {
			t.Errorf("new boot id not logged:\n%s", logs)
		}
	})
}

func TestRestartAfterKillResendsUnackedWithSameBootAndSeq(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, 0, 0)
	for i := 1; i <= 10; i++ {
		mustAppend(t, s, batch(i, "r"))
	}
	for seq := uint64(1); seq <= 3; seq++ {
		s.Cursor(0).Ack(seq)
	}
	boot := s.BootID()
	s.abandon() // kill -9: no Close, no fsync, no state write

	s = open(t, dir, 0, 0)
	defer s.Close()
	if s.BootID() != boot {
		t.Fatalf("boot id %q after restart, want %q", s.BootID(), boot)
	}
	if got := seqs(unacked(t, s)); fmt.Sprint(got) != "[4 5 6 7 8 9 10]" {
		t.Errorf("unacked after restart %v", got)
	}
	b := batch(11, "r")
	mustAppend(t, s, b)
	if b.Seq != 11 {
		t.Errorf("seq continues at %d, want 11", b.Seq)
	}
}

func TestSecondOpenOfTheSameDirFails(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, 0, 0)
	defer s.Close()
	if _, err := Open(dir, 0, nil); err == nil || !strings.Contains(err.Error(), "in use") {
		t.Errorf("second open: %v", err)
	}
}

func TestBoundsAreValidated(t *testing.T) {
	if _, err := Open(t.TempDir(), 100, nil); err == nil {
		t.Error("100-byte spool accepted")
	}
	if _, err := Open("", 0, nil); err == nil {
		t.Error("empty dir accepted")
	}
}

func TestRejectedBatchIsReportedLost(t *testing.T) {
	s := open(t, t.TempDir(), 0, 0)
	defer s.Close()
	mustAppend(t, s, batch(7, "r"))
	s.Cursor(0).Reject(1, "bad window")
	b := batch(8, "r")
	mustAppend(t, s, b)
	if len(b.Losses) != 1 || b.Losses[0].Tokens != 7 || b.Losses[0].Reason != "rejected: bad window" || b.Losses[0].Seq != 0 {
		t.Errorf("losses %v", b.Losses)
	}
	if st := s.Stats(); st.Rejected != 1 || st.Unacked != 1 {
		t.Errorf("stats %+v", st)
	}
}

// diskFile fails writes with ENOSPC once the directory would exceed capacity.
type diskFile struct {
	*os.File
	dir      string
	capacity int64
	torn     bool
}

func dirBytes(dir string) int64 {
	var n int64
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if fi, err := e.Info(); err == nil && e.Name() != ackName {
			n += fi.Size()
		}
	}
	return n
}

func (d *diskFile) Write(p []byte) (int, error) {
	free := d.capacity - dirBytes(d.dir)
	if int64(len(p)) <= free {
		return d.File.Write(p)
	}
	if d.torn && free > 0 { // a partial write, as a real full disk gives
		n, _ := d.File.Write(p[:free])
		return n, &os.PathError{Op: "write", Path: d.Name(), Err: syscall.ENOSPC}
	}
	return 0, &os.PathError{Op: "write", Path: d.Name(), Err: syscall.ENOSPC}
}

func TestENOSPCDropsOldestRetriesAndNeverFails(t *testing.T) {
	for _, torn := range []bool{false, true} {
		t.Run(fmt.Sprintf("torn=%v", torn), func(t *testing.T) {
			dir := t.TempDir()
			const capacity = 20 << 10
			lg, logs := testLogger(t)
			// No in-memory tail: the check below reads every held record
			// back from its file, where a torn one would show.
			s, err := OpenWith(dir, 1<<30, Options{Logger: lg, SegmentBytes: 4 << 10, TailBytes: -1,
				OpenFile: func(name string, flag int, perm os.FileMode) (WriteFile, error) {
					f, err := os.OpenFile(name, flag, perm)
					if err != nil {
						return nil, err
					}
					return &diskFile{File: f, dir: dir, capacity: capacity, torn: torn}, nil
				}})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			var sent uint64
			for i := 1; i <= 300; i++ {
				if err := s.Append(batch(i, "r")); err != nil {
					t.Logf("append %d: %v", i, err)
				}
				sent += uint64(i)
				if d := dirBytes(dir); d > capacity {
					t.Fatalf("files use %d bytes on a %d-byte disk", d, capacity)
				}
			}
			st := s.Stats()
			if st.ENOSPC == 0 || st.Dropped == 0 || st.MaxBytes > capacity {
				t.Errorf("stats %+v", st)
			}
			if st.Appended+st.Dropped < 300 {
				t.Errorf("appended %d + dropped %d < 300", st.Appended, st.Dropped)
			}
			tt := account(t, s)
			if tt.heldTokens+tt.lostTokens != sent {
				t.Errorf("held %d + lost %d tokens != sent %d", tt.heldTokens, tt.lostTokens, sent)
			}
			if !strings.Contains(logs.String(), "disk full") {
				t.Errorf("disk full not logged")
			}
			// Every held record reads back intact (no torn record left behind).
			if got := unacked(t, s); uint64(len(got)) != 300-st.Dropped {
				t.Errorf("held %d, want %d", len(got), 300-st.Dropped)
			}
			if s.Stats().CorruptRecords != 0 {
				t.Errorf("a record was left torn")
			}
		})
	}
}

func TestPendingLossSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, 0, 0)
	mustAppend(t, s, batch(5, "r"))
	s.Cursor(0).Reject(1, "nope") // loss pending, no batch to carry it yet
	s.abandon()
	s = open(t, dir, 0, 0)
	defer s.Close()
	b := batch(6, "r")
	mustAppend(t, s, b)
	if len(b.Losses) != 1 || b.Losses[0].Tokens != 5 {
		t.Errorf("pending loss lost across a restart: %v", b.Losses)
	}
	// Carried once only.
	b = batch(7, "r")
	mustAppend(t, s, b)
	if len(b.Losses) != 0 {
		t.Errorf("loss carried twice: %v", b.Losses)
	}
}

func TestConcurrentAppendAckRead(t *testing.T) {
	s := open(t, t.TempDir(), 256<<10, 8<<10)
	defer s.Close()
	var wg sync.WaitGroup
	acks := make(chan uint64, 1024)
	wg.Add(3)
	go func() {
		defer wg.Done()
		defer close(acks)
		for i := 1; i <= 2000; i++ {
			b := batch(i, "r")
			if err := s.Append(b); err != nil {
				t.Error(err)
				return
			}
			acks <- b.Seq
		}
	}()
	go func() {
		defer wg.Done()
		for seq := range acks {
			s.Cursor(0).MarkSent(seq)
			s.Cursor(0).Ack(seq)
		}
	}()
	go func() {
		defer wg.Done()
		for i := 0; i < 200; i++ {
			if _, err := s.Cursor(0).ReadAfter(0, 16); err != nil {
				t.Error(err)
				return
			}
			_ = s.Stats()
		}
	}()
	wg.Wait()
	if st := s.Stats(); st.Acked+st.Dropped != 2000 || st.Unacked != 0 {
		t.Errorf("stats %+v", st)
	}
	if n := len(segFiles(t, s.dir)); n > 1 {
		t.Errorf("%d segments left with everything acked", n)
	}
}

// realisticBatch is a 1 s batch of an 8-GPU node with two active runs, every
// field filled as the ledger fills it.
func realisticBatch(i int) *trainmeterv1.Batch {
	ws := t0.Add(time.Duration(i) * time.Second)
	b := &trainmeterv1.Batch{Seq: uint64(i), WindowStart: timestamppb.New(ws), WindowEnd: timestamppb.New(ws.Add(time.Second)),
		Host: &trainmeterv1.HostWindow{MemoryUsedMib: 412345.5, MemoryTotalMib: 2063523.1, CpuPct: 37.25, CpuCount: 128}}
	for g := 0; g < 8; g++ {
		b.GpuWindows = append(b.GpuWindows, &trainmeterv1.GpuWindow{Gpu: uint32(g), Uuid: fmt.Sprintf("GPU-6f1e2a3b-4c5d-6e7f-8091-a2b3c4d5e6f%d", g),
			EnergyCounterJ: 612.345, CounterOk: true, EnergyIntegratedJ: 609.87, PowerAvgW: 611.2, PowerMaxW: 698.4,
			PowerLastW: 605.1, Samples: 20, StaleSamples: 10, GapS: 0, MemoryUsedMaxMib: 71234, MemoryUsedAvgMib: 70123.4,
			MemoryTotalMib: 81559, UtilizationAvgPct: 97.5})
	}
	for r, id := range []string{"llama-3-8b-sft-2025-01-01-a", "llama-3-8b-sft-2025-01-01-b"} {
		b.RunWindows = append(b.RunWindows, &trainmeterv1.RunWindow{RunId: id, Start: b.WindowStart, End: b.WindowEnd,
			Phase: trainmeterv1.Phase_PHASE_MEASURED, EnergyCounterJ: 2449.38, CounterOk: true, EnergyIntegratedJ: 2439.5,
			PeakPowerW: 2793.6, VramPeakMib: 71234, VramSumMib: 5609872, VramSamples: 80, GpuSeconds: 4,
			Tokens: 131072, TokensMeasured: 131072, Steps: 2, Samples: 64, DataWaitS: 0.024, ComputeS: 0.82,
			UtilizationSumPct: 7800, Gpus: []uint32{uint32(4 * r), uint32(4*r + 1), uint32(4*r + 2), uint32(4*r + 3)},
			LastLoss: proto.Float64(1.8734)})
	}
	return b
}

func TestRealisticBatchSize(t *testing.T) {
	rec, err := encodeRecord(realisticBatch(123456))
	if err != nil {
		t.Fatal(err)
	}
	perDay := float64(len(rec)) * 86400
	days := float64(DefaultMaxBytes) / perDay
	t.Logf("8 GPUs + 2 runs: %d bytes per record; %.1f MB per day; DefaultMaxBytes holds %.1f days", len(rec), perDay/1e6, days)
	if len(rec) < 800 || len(rec) > 4000 {
		t.Errorf("record size %d is outside what the DefaultMaxBytes comment assumes", len(rec))
	}
	if days < 3 {
		t.Errorf("default spool holds only %.1f days", days)
	}
}

func BenchmarkAppend(b *testing.B) {
	s, err := Open(b.TempDir(), 64<<20, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	tmpl := realisticBatch(1)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		bt := proto.Clone(tmpl).(*trainmeterv1.Batch)
		if err := s.Append(bt); err != nil {
			b.Fatal(err)
		}
		s.Cursor(0).Ack(bt.Seq)
	}
}

// flakyState fails every third write of the state file with ENOSPC, so the
// state write's own room-making (dropping the oldest segment) runs inside
// evictions, acks and rejects.
type flakyState struct {
	*os.File
	n *int
}

func (f flakyState) Write(p []byte) (int, error) {
	if strings.HasSuffix(f.Name(), stateName+".tmp") {
		*f.n++
		if *f.n%3 == 0 {
			return 0, &os.PathError{Op: "write", Path: f.Name(), Err: syscall.ENOSPC}
		}
	}
	return f.File.Write(p)
}

func TestStateWriteOnFullDiskMakesRoomWithoutCorruptingTheSpool(t *testing.T) {
	var n int
	lg, _ := testLogger(t)
	s, err := OpenWith(t.TempDir(), 16<<10, Options{Logger: lg, SegmentBytes: 1 << 10,
		OpenFile: func(name string, flag int, perm os.FileMode) (WriteFile, error) {
			f, err := os.OpenFile(name, flag, perm)
			if err != nil {
				return nil, err
			}
			return flakyState{File: f, n: &n}, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	var sent uint64
	var acked uint64
	for i := 1; i <= 400; i++ {
		b := batch(i, "r")
		if err := s.Append(b); err != nil {
			t.Fatalf("append %d: %v", i, err)
		}
		sent += uint64(i)
		switch {
		case i%7 == 0:
			s.Cursor(0).Reject(b.Seq, "test")
		case i%5 == 0:
			s.Cursor(0).MarkSent(b.Seq)
		case i%3 == 0:
			before := s.Stats().Acked
			s.Cursor(0).Ack(b.Seq)
			if s.Stats().Acked > before { // not when it was dropped already
				acked += uint64(i)
				for _, l := range b.Losses { // delivered with it
					acked += l.Tokens
				}
			}
		}
	}
	if n < 10 {
		t.Fatalf("only %d state writes", n)
	}
	tt := account(t, s)
	if tt.heldTokens+tt.lostTokens+acked != sent {
		t.Errorf("held %d + lost %d + acked %d tokens != sent %d", tt.heldTokens, tt.lostTokens, acked, sent)
	}
	if err := s.Close(); err != nil {
		t.Logf("close: %v", err)
	}
}

func TestFlushPendingCarriesTheLastLossReport(t *testing.T) {
	s := open(t, t.TempDir(), 0, 0)
	defer s.Close()
	if err := s.FlushPending(t0); err != nil || s.Len() != 0 {
		t.Fatalf("nothing pending: err %v len %d", err, s.Len())
	}
	mustAppend(t, s, batch(9, "r"))
	s.Cursor(0).Reject(1, "x")
	if err := s.FlushPending(t0); err != nil {
		t.Fatal(err)
	}
	got := unacked(t, s)
	if len(got) != 1 || len(got[0].Losses) != 1 || got[0].Losses[0].Tokens != 9 || got[0].WindowStart == nil {
		t.Errorf("carrier batch %v", got)
	}
}

// A pending in-doubt loss record keeps its window_start across a restart
// (the state file).
func TestInDoubtLossKeepsItsWindowStartInTheStateFile(t *testing.T) {
	ws := timestamppb.New(t0.Add(1500 * time.Millisecond))
	l := &trainmeterv1.DataLoss{RunId: "r", Batches: 1, Tokens: 5, Reason: "spool full", Seq: 7, WindowStart: ws, SpoolCollectors: 2}
	got := decodeLoss(encodeLoss(l))
	if !proto.Equal(got, l) {
		t.Errorf("decoded %v, want %v", got, l)
	}
	old := decodeLoss([]byte(`{"run_id":"r","batches":1,"tokens":5,"energy_j":0,"gpu_seconds":0,"reason":"x","seq":7}`))
	if old == nil || old.WindowStart != nil || old.Seq != 7 {
		t.Errorf("state from before window_start: %v", old)
	}
}

// withHost gives b one RAPL interval: cpu and dram J for each of runs, and
// idle J the node spent with no run.
func withHost(b *trainmeterv1.Batch, cpu, dram, idle float64, runs ...string) *trainmeterv1.Batch {
	h := &trainmeterv1.HostEnergy{Start: b.WindowStart, End: b.WindowEnd, DramOk: true,
		CpuEnergyJ: cpu*float64(len(runs)) + idle, DramEnergyJ: dram * float64(len(runs)), IdleCpuEnergyJ: idle}
	for _, r := range runs {
		h.Runs = append(h.Runs, &trainmeterv1.HostEnergyShare{RunId: r, CpuEnergyJ: cpu, DramEnergyJ: dram,
			Share: 1 / float64(len(runs)), Split: "equal"})
	}
	b.HostEnergy = append(b.HostEnergy, h)
	return b
}

// pendingLosses is every loss record the spool holds: on the batches it
// keeps and not yet carried; the node's have an empty run id.
func pendingLosses(t *testing.T, s *Spool) []*trainmeterv1.DataLoss {
	t.Helper()
	var out []*trainmeterv1.DataLoss
	for _, b := range unacked(t, s) {
		for _, l := range b.NodeLosses {
			if l.RunId != "" {
				t.Errorf("a node loss record names run %q", l.RunId)
			}
		}
		out = append(append(out, b.Losses...), b.NodeLosses...)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, l := range slices.Concat(s.sortedLosses(), s.seqLosses) {
		out = append(out, proto.Clone(l).(*trainmeterv1.DataLoss))
	}
	return out
}

// A dropped batch's CPU+DRAM shares are lost with it, per run, like its GPU
// energy: held + lost host energy is what was appended.
func TestFullSpoolAccountsTheDroppedHostEnergyPerRun(t *testing.T) {
	s := open(t, t.TempDir(), 32<<10, 4<<10)
	defer s.Close()
	const n = 400
	appended := map[string]float64{}
	for i := 1; i <= n; i++ {
		b := withHost(batch(i, "a", "b"), float64(i), 0.5, 3, "a", "b")
		if i%50 == 0 {
			// Run c's last host interval, a batch after its last window.
			b = withHost(b, 0, 0, 0)
			b.HostEnergy[1].Runs = []*trainmeterv1.HostEnergyShare{{RunId: "c", CpuEnergyJ: 2, DramEnergyJ: 1, Share: 1, Split: "exclusive"}}
			appended["c"] += 3
		}
		appended["a"] += float64(i) + 0.5
		appended["b"] += float64(i) + 0.5
		mustAppend(t, s, b)
	}
	if s.Stats().Dropped == 0 {
		t.Fatal("nothing dropped: the test needs a smaller spool")
	}
	held := map[string]float64{}
	for _, b := range unacked(t, s) {
		for _, h := range b.HostEnergy {
			for _, sh := range h.Runs {
				held[sh.RunId] += sh.CpuEnergyJ + sh.DramEnergyJ
			}
		}
	}
	lost := map[string]float64{}
	var lostBatches = map[string]uint64{}
	for _, l := range pendingLosses(t, s) {
		lost[l.RunId] += l.HostEnergyJ
		lostBatches[l.RunId] += l.Batches
	}
	for run, want := range appended {
		if got := held[run] + lost[run]; math.Abs(got-want) > 1e-6 {
			t.Errorf("run %s: held %.1f + lost %.1f J host energy = %.1f, appended %.1f", run, held[run], lost[run], got, want)
		}
	}
	if lost["a"] == 0 || lost["c"] == 0 {
		t.Errorf("no host energy reported lost: %v", lost)
	}
	if lostBatches["a"] != s.Stats().Dropped {
		t.Errorf("run a lost %d batches, %d dropped", lostBatches["a"], s.Stats().Dropped)
	}
}

// An in-doubt loss (the batch was sent, never acked) carries the batch's
// host energy in its own record, and a pending one keeps it in the state
// file across a restart.
func TestInDoubtAndPendingLossesKeepTheirHostEnergy(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, 16<<10, 4<<10)
	mustAppend(t, s, withHost(batch(1, "r"), 7, 2, 0, "r"))
	s.Cursor(0).MarkSent(1)
	for i := 2; s.Stats().Dropped < 2; i++ {
		mustAppend(t, s, withHost(batch(i, "r"), 1, 0, 0, "r"))
	}
	var doubt *trainmeterv1.DataLoss
	var certain float64
	for _, l := range pendingLosses(t, s) {
		if l.RunId == "" {
			continue
		}
		if l.Seq == 1 {
			doubt = l
		} else {
			certain += l.HostEnergyJ
		}
	}
	if doubt == nil || doubt.HostEnergyJ != 9 {
		t.Errorf("in-doubt loss record of seq 1 %v, want host_energy_j 9", doubt)
	}
	if certain == 0 {
		t.Error("the batches dropped unsent carry no host energy")
	}

	s.Cursor(0).Reject(s.Stats().Dropped+1, "bad")
	s.abandon()
	s = open(t, dir, 0, 0)
	defer s.Close()
	var after float64
	for _, l := range pendingLosses(t, s) {
		if l.RunId != "" {
			after += l.HostEnergyJ
		}
	}
	if want := 9 + certain + 1; math.Abs(after-want) > 1e-9 {
		t.Errorf("after a restart the pending loss records hold %.1f J host energy, want %.1f", after, want)
	}
}

// withGPU gives b one GPU's window: busy J and s for the runs, idle J and s
// for no run.
func withGPU(b *trainmeterv1.Batch, busy, idle, busyS, idleS float64) *trainmeterv1.Batch {
	b.GpuWindows = append(b.GpuWindows, &trainmeterv1.GpuWindow{Gpu: 0, CounterOk: true,
		EnergyCounterJ: busy + idle, IdleEnergyCounterJ: idle, GpuSeconds: busyS + idleS, IdleGpuSeconds: idleS})
	return b
}

// nodeFigures are a node's totals and idle parts.
type nodeFigures struct{ energy, idleEnergy, gpuS, idleGPUS, host, idleHost float64 }

func (n *nodeFigures) addLoss(l *trainmeterv1.DataLoss) {
	n.energy += l.EnergyJ
	n.idleEnergy += l.IdleEnergyJ
	n.gpuS += l.GpuSeconds
	n.idleGPUS += l.IdleGpuSeconds
	n.host += l.HostEnergyJ
	n.idleHost += l.IdleHostEnergyJ
}

func (n *nodeFigures) addBatch(b *trainmeterv1.Batch) {
	for _, gw := range b.GpuWindows {
		n.energy += gw.EnergyCounterJ
		n.idleEnergy += gw.IdleEnergyCounterJ
		n.gpuS += gw.GpuSeconds
		n.idleGPUS += gw.IdleGpuSeconds
	}
	for _, h := range b.HostEnergy {
		n.host += h.CpuEnergyJ + h.DramEnergyJ
		n.idleHost += h.IdleCpuEnergyJ + h.IdleDramEnergyJ
	}
}

// The node's part of dropped batches (every GPU's energy and time, its
// CPU+DRAM, with their idle parts) is reported in node loss records, so
// held + lost is what was appended for the node too; a batch with no run
// at all (an idle node) is reported as well.
func TestFullSpoolAccountsTheDroppedNodeTotalsAndIdle(t *testing.T) {
	s := open(t, t.TempDir(), 32<<10, 4<<10)
	defer s.Close()
	const n = 400
	var appended nodeFigures
	for i := 1; i <= n; i++ {
		runs := []string{"a"}
		if i%3 == 0 {
			runs = nil // nothing ran: all idle
		}
		b := withGPU(withHost(batch(i, runs...), 2, 1, 4, runs...), float64(len(runs))*100, 30, float64(len(runs))*0.7, 0.3)
		appended.addBatch(b)
		mustAppend(t, s, b)
	}
	dropped := s.Stats().Dropped
	if dropped == 0 {
		t.Fatal("nothing dropped: the test needs a smaller spool")
	}
	var held, lost nodeFigures
	var lostBatches uint64
	first := t0.Add(time.Hour)
	for _, b := range unacked(t, s) {
		held.addBatch(b)
		for _, l := range b.Losses {
			if l.RunId == "" {
				t.Errorf("a node loss record among the runs' losses: %v", l)
			}
		}
	}
	for _, l := range pendingLosses(t, s) {
		if l.RunId != "" {
			continue
		}
		lost.addLoss(l)
		lostBatches += l.Batches
		if l.FirstWindowStart == nil {
			t.Errorf("node loss record without first_window_start: %v", l)
		} else if ft := l.FirstWindowStart.AsTime(); ft.Before(first) {
			first = ft
		}
	}
	near := func(what string, held, lost, want float64) {
		t.Helper()
		if math.Abs(held+lost-want) > 1e-6 || lost == 0 {
			t.Errorf("node %s: held %.2f + lost %.2f = %.2f, appended %.2f", what, held, lost, held+lost, want)
		}
	}
	near("GPU energy", held.energy, lost.energy, appended.energy)
	near("idle GPU energy", held.idleEnergy, lost.idleEnergy, appended.idleEnergy)
	near("GPU-seconds", held.gpuS, lost.gpuS, appended.gpuS)
	near("idle GPU-seconds", held.idleGPUS, lost.idleGPUS, appended.idleGPUS)
	near("host energy", held.host, lost.host, appended.host)
	near("idle host energy", held.idleHost, lost.idleHost, appended.idleHost)
	if lostBatches != dropped {
		t.Errorf("node loss records count %d batches, %d dropped", lostBatches, dropped)
	}
	if !first.Equal(batch(1).WindowStart.AsTime()) {
		t.Errorf("earliest first_window_start %v, want the first dropped batch's %v", first, batch(1).WindowStart.AsTime())
	}
}

// An in-doubt drop (sent, never acked) gives the node its own record with
// the batch's seq and window start, like the runs', and a pending node
// record keeps its figures in the state file.
func TestNodeLossInDoubtAndAcrossARestart(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, 16<<10, 4<<10)
	mustAppend(t, s, withGPU(withHost(batch(1, "r"), 7, 2, 5, "r"), 100, 20, 0.5, 0.5))
	s.Cursor(0).MarkSent(1)
	for i := 2; s.Stats().Dropped < 2; i++ {
		mustAppend(t, s, withGPU(batch(i, "r"), 100, 20, 0.5, 0.5))
	}
	var doubt *trainmeterv1.DataLoss
	for _, l := range pendingLosses(t, s) {
		if l.RunId == "" && l.Seq == 1 {
			doubt = l
		}
	}
	want := &trainmeterv1.DataLoss{Batches: 1, EnergyJ: 120, IdleEnergyJ: 20, GpuSeconds: 1, IdleGpuSeconds: 0.5,
		HostEnergyJ: 14, IdleHostEnergyJ: 5, Reason: "spool full", Seq: 1, WindowStart: batch(1).WindowStart, FirstWindowStart: batch(1).WindowStart}
	if !proto.Equal(doubt, want) {
		t.Errorf("the node's in-doubt record of seq 1:\n%v\nwant\n%v", doubt, want)
	}
	s.Cursor(0).Reject(s.Stats().Dropped+1, "bad")
	s.abandon()
	s = open(t, dir, 0, 0)
	defer s.Close()
	var node nodeFigures
	for _, l := range pendingLosses(t, s) {
		if l.RunId == "" && l.Seq == 0 {
			node.addLoss(l)
		}
	}
	if node.energy == 0 || node.idleEnergy == 0 || node.idleGPUS == 0 || node.energy != 120*float64(int(node.gpuS)) {
		t.Errorf("after a restart the node's pending records hold %+v", node)
	}
}

// A batch too big for the whole spool is dropped unwritten: the node's and
// runs' pending records it was to carry stay pending once, not twice.
func TestUnwrittenBatchDoesNotCountThePendingRecordsAgain(t *testing.T) {
	s := open(t, t.TempDir(), MinMaxBytes, 0)
	defer s.Close()
	mustAppend(t, s, withGPU(batch(1, "r"), 100, 20, 0.5, 0.5))
	s.Cursor(0).Reject(1, "bad") // pending: r's record and the node's, one batch each
	huge := withGPU(batch(2, "r"), 100, 20, 0.5, 0.5)
	huge.RawSamples = []*trainmeterv1.RawSamples{{Gpu: 0, TUnixNs: make([]uint64, MinMaxBytes/4)}}
	if err := s.Append(huge); err == nil {
		t.Fatal("a batch bigger than the spool was kept")
	}
	batches := map[string]uint64{}
	for _, l := range pendingLosses(t, s) {
		batches[l.RunId] += l.Batches
	}
	if batches["r"] != 2 || batches[""] != 2 {
		t.Errorf("pending records count %d batches for r and %d for the node, want 2 and 2", batches["r"], batches[""])
	}
}
