package spool

import (
	"fmt"
	"os"
	"sync"
	"testing"

	"google.golang.org/protobuf/proto"

	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// readOpens counts the segment opens for reading.
type readOpens struct {
	mu sync.Mutex
	n  int
}

func (c *readOpens) open(name string) (ReadFile, error) {
	c.mu.Lock()
	c.n++
	c.mu.Unlock()
	return os.Open(name)
}

func (c *readOpens) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

func openCounting(t *testing.T, dir string, tailBytes int64) (*Spool, *readOpens) {
	t.Helper()
	lg, _ := testLogger(t)
	c := &readOpens{}
	s, err := OpenWith(dir, 0, Options{Logger: lg, SegmentBytes: 64 << 10, OpenRead: c.open, TailBytes: tailBytes})
	if err != nil {
		t.Fatal(err)
	}
	return s, c
}

func TestBatchJustAppendedIsSentFromMemory(t *testing.T) {
	s, opens := openCounting(t, t.TempDir(), 0)
	defer s.Close()
	for i := 1; i <= 50; i++ {
		b := batch(i, "r1", "r2")
		mustAppend(t, s, b)
		want := proto.Clone(b).(*trainmeterv1.Batch)
		got, err := s.Cursor(0).ReadAfter(uint64(i-1), 10)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 1 || !proto.Equal(got[0], want) {
			t.Fatalf("batch %d read back as %v, want %v", i, got, want)
		}
		s.Cursor(0).Ack(uint64(i))
	}
	if n := opens.count(); n != 0 {
		t.Errorf("segment opened %d times to send batches appended a moment before; want 0", n)
	}
	if s.tailBytes != 0 || len(s.tail) > 1 {
		t.Errorf("acked records still held in memory: %d bytes, %d entries", s.tailBytes, len(s.tail))
	}
}

func TestRecordEvictedFromTheTailIsReadFromItsFile(t *testing.T) {
	rec, err := encodeRecord(batch(1, "r1", "r2"))
	if err != nil {
		t.Fatal(err)
	}
	// Room for three records in memory.
	s, opens := openCounting(t, t.TempDir(), int64(3*len(rec)+len(rec)/2))
	defer s.Close()
	var want []*trainmeterv1.Batch
	for i := 1; i <= 10; i++ {
		b := batch(i, "r1", "r2")
		mustAppend(t, s, b)
		want = append(want, proto.Clone(b).(*trainmeterv1.Batch))
	}
	got, err := s.Cursor(0).ReadAfter(7, 10)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(seqs(got)) != "[8 9 10]" || opens.count() != 0 {
		t.Fatalf("newest three: seqs %v with %d opens; want [8 9 10] from memory", seqs(got), opens.count())
	}
	got = unacked(t, s)
	if len(got) != 10 {
		t.Fatalf("read back %d batches, want 10", len(got))
	}
	for i := range got {
		if !proto.Equal(got[i], want[i]) {
			t.Errorf("batch %d read back differs:\n%v\n%v", i+1, got[i], want[i])
		}
	}
	// One segment: one open for the seven evicted records, not one each.
	if n := opens.count(); n != 1 {
		t.Errorf("segment opened %d times for the evicted records; want 1", n)
	}
}

func TestDamageToAnEvictedRecordIsStillDetected(t *testing.T) {
	s, _ := openCounting(t, t.TempDir(), 1) // nothing fits: every read from the file
	defer s.Close()
	for i := 1; i <= 3; i++ {
		mustAppend(t, s, batch(i, "r"))
	}
	r := s.bySeq[2]
	f, err := os.OpenFile(r.seg.path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte{0xff, 0xfe}, r.off+recHeader+2); err != nil {
		t.Fatal(err)
	}
	_ = f.Close()
	got := unacked(t, s)
	if fmt.Sprint(seqs(got)) != "[1 3]" {
		t.Errorf("read back %v; want the damaged seq 2 left out", seqs(got))
	}
	if st := s.Stats(); st.CorruptRecords != 1 || st.Dropped != 1 {
		t.Errorf("damage not counted: %+v", st)
	}
}

func TestTailNeverServesAckedDroppedOrRemovedRecords(t *testing.T) {
	dir := t.TempDir()
	lg, _ := testLogger(t)
	// A small spool: the oldest segment is dropped to make room.
	s, err := OpenWith(dir, 16<<10, Options{Logger: lg, SegmentBytes: 4 << 10})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for i := 1; i <= 600; i++ {
		mustAppend(t, s, batch(i, "r"))
		if i%3 == 0 {
			s.Cursor(0).Ack(uint64(i))
		}
	}
	st := s.Stats()
	if st.Dropped == 0 {
		t.Fatalf("nothing dropped; the test wants evictions: %+v", st)
	}
	got := unacked(t, s)
	held := 0
	for _, g := range s.segs {
		for _, r := range g.recs {
			if r.data != nil && r.done {
				t.Errorf("seq %d is acked or gone but still in memory", r.seq)
			}
			if !r.done {
				held++
			}
		}
	}
	for _, b := range got {
		if b.Seq%3 == 0 || s.bySeq[b.Seq] == nil {
			t.Errorf("seq %d read back: acked or removed", b.Seq)
		}
	}
	if len(got) != held || uint64(held) != uint64(st.Unacked) {
		t.Errorf("read back %d, held %d, unacked %d", len(got), held, st.Unacked)
	}
	var inTail int64
	for _, r := range s.tail {
		if r.data != nil {
			if s.bySeq[r.seq] != r {
				t.Errorf("seq %d in memory after its segment was removed", r.seq)
			}
			inTail += int64(len(r.data))
		}
	}
	if inTail != s.tailBytes {
		t.Errorf("tail counts %d bytes, holds %d", s.tailBytes, inTail)
	}
}
