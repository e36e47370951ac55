package ingest

import (
	"strings"
	"testing"

	tu "github.com/trainmeter/trainmeter/collector/internal/testutil"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// A run_start for a run that ended on another node is answered on the
// stream with a StartRefused advisory before the batch's ack: the reason is
// the trainer's error line, the start time names the refused start.
func TestRefusedStartIsSentBackBeforeTheAck(t *testing.T) {
	st := openStore(t)
	ing, conn := serve(t, st)
	box1 := tu.Connect(t, conn, "box1", "b1")
	box1.MustAck(tu.Batch(1, 0, []*trainmeterv1.RunWindow{tu.Window("shareA", 0, 100, 10)}, tu.Start("shareA", 0, "m"), tu.End("shareA", 1)))

	box2 := tu.Connect(t, conn, "box2", "b2")
	resp, err := box2.Send(tu.Batch(1, 20, []*trainmeterv1.RunWindow{tu.Window("shareA", 20, 500, 10)}, tu.Start("shareA", 20, "m")))
	if err != nil {
		t.Fatal(err)
	}
	ref := resp.GetAdvisory().GetStartRefused()
	if ref == nil || resp.GetAdvisory().GetRunId() != "shareA" {
		t.Fatalf("first response %v, want a StartRefused advisory for shareA", resp)
	}
	if !ref.GetStart().AsTime().Equal(tu.TS(20).AsTime()) || !strings.Contains(ref.GetReason(), `run_start: run "shareA" already ended`) {
		t.Errorf("refusal %v: want the start's time and the error line", ref)
	}
	if ack, err := box2.Stream.Recv(); err != nil || ack.GetAck().GetSeq() != 1 {
		t.Fatalf("after the refusal: %v %v, want the batch's ack", ack, err)
	}
	if got := ing.Stats().RefusedStarts; got != 1 {
		t.Errorf("refused_starts %d, want 1", got)
	}
	s, err := st.GetRun("shareA")
	if err != nil || s.Tokens != 100 || len(s.Nodes) != 1 {
		t.Fatalf("the ended run after the refused start: %+v %v", s, err)
	}
}
