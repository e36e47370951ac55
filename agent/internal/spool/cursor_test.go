package spool

import (
	"slices"
	"testing"

	"google.golang.org/protobuf/types/known/timestamppb"

	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

func openPair(t *testing.T, dir string, maxBytes, segBytes int64, names ...string) *Spool {
	t.Helper()
	lg, _ := testLogger(t)
	s, err := OpenWith(dir, maxBytes, Options{Logger: lg, SegmentBytes: segBytes, Collectors: names})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func readAll(t *testing.T, c *Cursor) []*trainmeterv1.Batch {
	t.Helper()
	bs, err := c.ReadAfter(0, 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range bs {
		for _, l := range b.Losses {
			if l.SpoolCollectors != 0 {
				t.Fatalf("collector %q would see a spool-internal mask: %v", c.Name(), l)
			}
		}
		for _, e := range b.RunEvents {
			if e.SpoolCollectors != 0 {
				t.Fatalf("collector %q would see a spool-internal mask: %v", c.Name(), e)
			}
		}
	}
	// The kept count agrees with the records.
	if c.Len() != len(bs) {
		t.Fatalf("collector %q: Len %d, but %d batches to read", c.Name(), c.Len(), len(bs))
	}
	return bs
}

func TestPairSpoolHoldsABatchUntilEveryCollectorAckedIt(t *testing.T) {
	s := openPair(t, t.TempDir(), 0, 4<<10, "a:1", "b:1")
	defer s.Close()
	a, b := s.Cursor(0), s.Cursor(1)
	for i := 1; i <= 200; i++ {
		mustAppend(t, s, batch(i, "r"))
	}
	for seq := uint64(1); seq <= 200; seq++ {
		a.Ack(seq)
	}
	if a.Len() != 0 || b.Len() != 200 || s.Len() != 200 {
		t.Fatalf("after a acked all: a.Len %d b.Len %d held %d, want 0 200 200", a.Len(), b.Len(), s.Len())
	}
	if got := readAll(t, a); len(got) != 0 {
		t.Errorf("a is given %d batches it acked", len(got))
	}
	if got := readAll(t, b); len(got) != 200 || got[0].Seq != 1 {
		t.Fatalf("b reads %d batches from seq %v, want all 200", len(got), seqs(got)[:min(len(got), 1)])
	}
	segs := s.Stats().Segments
	for seq := uint64(1); seq <= 200; seq++ {
		b.Ack(seq)
	}
	if s.Len() != 0 || s.Stats().Segments >= segs {
		t.Errorf("after both acked: held %d, segments %d (were %d): acked segments not removed", s.Len(), s.Stats().Segments, segs)
	}
	if a.Stats().Acked != 200 || b.Stats().Acked != 200 {
		t.Errorf("per-collector acks %d %d", a.Stats().Acked, b.Stats().Acked)
	}
}

// Each collector's acks survive a restart, keyed by its name: a list given
// in the other order still sends each collector exactly what it lacks, and a
// collector added later gets what was still pending for any of them.
func TestPairSpoolCursorsPersistAcrossRestartByName(t *testing.T) {
	dir := t.TempDir()
	s := openPair(t, dir, 0, 4<<10, "a:1", "b:1")
	for i := 1; i <= 10; i++ {
		mustAppend(t, s, batch(i, "r"))
	}
	for seq := uint64(1); seq <= 7; seq++ {
		s.Cursor(0).Ack(seq)
	}
	for seq := uint64(1); seq <= 3; seq++ {
		s.Cursor(1).Ack(seq)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s = openPair(t, dir, 0, 4<<10, "b:1", "a:1", "c:1")
	defer s.Close()
	if got := seqs(readAll(t, s.Cursor(0))); !slices.Equal(got, []uint64{4, 5, 6, 7, 8, 9, 10}) {
		t.Errorf("b after restart reads %v, want 4..10", got)
	}
	if got := seqs(readAll(t, s.Cursor(1))); !slices.Equal(got, []uint64{8, 9, 10}) {
		t.Errorf("a after restart reads %v, want 8..10", got)
	}
	if got := seqs(readAll(t, s.Cursor(2))); !slices.Equal(got, []uint64{4, 5, 6, 7, 8, 9, 10}) {
		t.Errorf("c (new) reads %v, want what was pending: 4..10", got)
	}
}

// A spool opened without names (one unnamed cursor, kind-'A' acks) keeps its
// acks for the first collector of the new list; the collector added gets
// what was still pending, not what the first had already stored.
func TestPairSpoolKeepsASingleCollectorSpoolsAcks(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, 0, 4<<10)
	for i := 1; i <= 5; i++ {
		mustAppend(t, s, batch(i, "r"))
	}
	s.Cursor(0).Ack(1)
	s.Cursor(0).Ack(2)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openPair(t, dir, 0, 4<<10, "a:1", "b:1")
	defer s.Close()
	if got := seqs(readAll(t, s.Cursor(0))); !slices.Equal(got, []uint64{3, 4, 5}) {
		t.Errorf("first collector reads %v, want 3..5", got)
	}
	if got := seqs(readAll(t, s.Cursor(1))); !slices.Equal(got, []uint64{3, 4, 5}) {
		t.Errorf("second collector reads %v, want 3..5", got)
	}
}

// The disk bound with two cursors: collector a keeps up, b is down. The
// spool stays within its bound by dropping the oldest batches; they are lost
// for b only (b's loss records add up exactly, its dropped run_start comes
// on), and a, which had them, sees no loss at all.
func TestPairSpoolFullDropsOnlyForTheLaggingCollector(t *testing.T) {
	const bound = 32 << 10
	s := openPair(t, t.TempDir(), bound, 4<<10, "a:1", "b:1")
	defer s.Close()
	a, b := s.Cursor(0), s.Cursor(1)
	first := batch(1, "r")
	first.RunEvents = []*trainmeterv1.RunEvent{{Event: &trainmeterv1.RunEvent_RunStart{RunStart: &trainmeterv1.RunStart{RunId: "r", Time: timestamppb.New(t0)}}}}
	mustAppend(t, s, first)
	a.Ack(1)
	const n = 600
	sent := uint64(1)
	for i := 2; i <= n; i++ {
		mustAppend(t, s, batch(i, "r"))
		sent += uint64(i)
		if i < n {
			a.Ack(uint64(i)) // a acks all but the newest
		}
		if s.Bytes() > bound {
			t.Fatalf("append %d: %d bytes, bound %d", i, s.Bytes(), bound)
		}
	}
	st := s.Stats()
	if st.Dropped == 0 {
		t.Fatal("nothing dropped: the test did not fill the spool")
	}

	forA := readAll(t, a)
	if len(forA) != 1 || forA[0].Seq != n {
		t.Fatalf("a reads %v, want only the newest batch %d", seqs(forA), n)
	}
	if len(forA[0].Losses) != 0 || len(forA[0].NodeLosses) != 0 || len(forA[0].RunEvents) != 0 {
		t.Errorf("a, which acked every dropped batch, is sent losses %v, node losses %v and events %v", forA[0].Losses, forA[0].NodeLosses, forA[0].RunEvents)
	}

	forB := readAll(t, b)
	if uint64(len(forB))+st.Dropped != n {
		t.Fatalf("b: held %d + dropped %d != %d appended", len(forB), st.Dropped, n)
	}
	var held, lost, lostBatches, nodeLostBatches uint64
	starts := 0
	for _, x := range forB {
		for _, w := range x.RunWindows {
			held += w.Tokens
		}
		for _, l := range x.Losses {
			lost += l.Tokens
			lostBatches += l.Batches
		}
		for _, l := range x.NodeLosses {
			nodeLostBatches += l.Batches
		}
		for _, e := range x.RunEvents {
			if e.GetRunStart() != nil {
				starts++
			}
		}
	}
	s.mu.Lock()
	for _, l := range s.losses { // the newest drops wait for the next batch
		if l.RunId == "" {
			nodeLostBatches += l.Batches
			continue
		}
		lost += l.Tokens
		lostBatches += l.Batches
	}
	for _, e := range s.events {
		if e.GetRunStart() != nil {
			starts++
		}
	}
	s.mu.Unlock()
	if held+lost != sent || lostBatches != st.Dropped {
		t.Errorf("b: held %d + lost %d tokens != sent %d; lost batches %d, dropped %d", held, lost, sent, lostBatches, st.Dropped)
	}
	if starts != 1 {
		t.Errorf("b is carried %d run_starts of the dropped first batch, want 1", starts)
	}
	if nodeLostBatches != st.Dropped {
		t.Errorf("b: the node's loss records count %d batches, %d dropped", nodeLostBatches, st.Dropped)
	}
}

// A batch one collector refuses is lost there alone: the other still gets it.
func TestPairSpoolRejectIsPerCollector(t *testing.T) {
	s := openPair(t, t.TempDir(), 0, 4<<10, "a:1", "b:1")
	defer s.Close()
	a, b := s.Cursor(0), s.Cursor(1)
	mustAppend(t, s, batch(5, "r"))
	a.Reject(1, "bad")
	mustAppend(t, s, batch(6, "r"))
	if got := seqs(readAll(t, b)); !slices.Equal(got, []uint64{1, 2}) {
		t.Fatalf("b reads %v, want both batches", got)
	}
	forB := readAll(t, b)
	if len(forB[1].Losses) != 0 {
		t.Errorf("b is told of a loss that was a's alone: %v", forB[1].Losses)
	}
	forA := readAll(t, a)
	if len(forA) != 1 || len(forA[0].Losses) != 1 || forA[0].Losses[0].Tokens != 5 {
		t.Errorf("a reads %v, want batch 2 carrying the loss of batch 1 (5 tokens)", forA)
	}
	if a.Stats().Rejected != 1 || b.Stats().Rejected != 0 {
		t.Errorf("rejected a %d b %d", a.Stats().Rejected, b.Stats().Rejected)
	}
}

func TestPairSpoolRefusesABadCollectorList(t *testing.T) {
	for _, names := range [][]string{{"a:1", "a:1"}, {"1", "2", "3", "4", "5", "6", "7", "8", "9"}} {
		if s, err := OpenWith(t.TempDir(), 0, Options{Collectors: names}); err == nil {
			s.Close()
			t.Errorf("%v accepted", names)
		}
	}
}

// Loss records meant for one collector keep going to that collector after
// a restart with the list in the other order, or with it removed.
func TestPairSpoolLossesFollowTheCollectorAcrossARestart(t *testing.T) {
	dir := t.TempDir()
	s := openPair(t, dir, 32<<10, 4<<10, "a:1", "b:1")
	for i := 1; i <= 800; i++ {
		mustAppend(t, s, batch(i, "r"))
		s.Cursor(0).Ack(uint64(i)) // b lags
	}
	if s.Stats().Dropped == 0 {
		t.Fatal("nothing dropped")
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	lost := func(bs []*trainmeterv1.Batch) (n uint64) {
		for _, b := range bs {
			for _, l := range b.Losses {
				n += l.Batches
			}
		}
		return n
	}

	s = openPair(t, dir, 32<<10, 4<<10, "b:1", "a:1")
	mustAppend(t, s, batch(801, "r")) // carries the pending report, if any
	forB, forA := readAll(t, s.Cursor(0)), readAll(t, s.Cursor(1))
	if got := lost(forB); got == 0 {
		t.Error("b, now first, is told of no loss")
	}
	if got := lost(forA); got != 0 {
		t.Errorf("a, now second, is told of %d lost batches it had", got)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s = openPair(t, dir, 32<<10, 4<<10, "a:1")
	defer s.Close()
	if got := lost(readAll(t, s.Cursor(0))); got != 0 {
		t.Errorf("with b removed, a is told of %d lost batches that were b's", got)
	}
}

// Opened without a list (trainmeter-agent doctor does), a pair's spool keeps
// both collectors' acks: the agent started afterwards still owes the
// lagging collector what it had not acked.
func TestPairSpoolOpenedWithoutAListKeepsEveryCollectorsAcks(t *testing.T) {
	dir := t.TempDir()
	s := openPair(t, dir, 0, 4<<10, "a:1", "b:1")
	for i := 1; i <= 5; i++ {
		mustAppend(t, s, batch(i, "r"))
		s.Cursor(0).Ack(uint64(i))
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = open(t, dir, 0, 4<<10)
	if s.Len() != 5 || s.Cursors() != 2 {
		t.Errorf("opened without a list: %d held, %d cursors; want 5 and 2", s.Len(), s.Cursors())
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openPair(t, dir, 0, 4<<10, "a:1", "b:1")
	defer s.Close()
	if got := seqs(readAll(t, s.Cursor(1))); !slices.Equal(got, []uint64{1, 2, 3, 4, 5}) {
		t.Errorf("b reads %v after a look without a list, want 1..5", got)
	}
	if got := readAll(t, s.Cursor(0)); len(got) != 0 {
		t.Errorf("a reads %v, want nothing", seqs(got))
	}
}
