package ledger

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/trainmeter/trainmeter/agent/internal/trainerproto"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// A run of `trainmeter run` (attribute_pid) takes the fields its command
// line left out from the first client that names them, and ships its start
// again with them; a field both name differently keeps the wrapper's value
// and the join still counts.
func TestAttributedRunIsFilledByTheJoiningClient(t *testing.T) {
	r := attributedRig(t, false)
	r.advance(time.Second)
	start := r.now
	wrapper := &trainerproto.RunStart{Run: "a", AttributePID: ptr(uint64(9)), ClientID: "tm-run", Start: &trainmeterv1.RunStart{
		Metadata: &trainmeterv1.RunMetadata{Model: "cli-model", BatchSize: ptr(int64(16))}, Labels: map[string]string{"team": "nlp"}}}
	if err := r.l.StartRun(start, peer1, wrapper); err != nil {
		t.Fatal(err)
	}
	r.advance(time.Second)
	peer2 := Peer{ConnID: 2, PID: 101, UID: 1000}
	script := &trainerproto.RunStart{Run: "a", ClientID: "py", Start: &trainmeterv1.RunStart{
		Metadata: &trainmeterv1.RunMetadata{Model: "sim-model", Dataset: "synthetic", BatchSize: ptr(int64(4)), SeqLen: ptr(int64(2048))},
		Params:   124_000_000, NumWorkers: ptr(uint32(0)), Labels: map[string]string{"team": "vision", "exp": "7"}}}
	err := r.l.StartRun(r.now, peer2, script)
	var mc *MetadataConflict
	if !errors.As(err, &mc) {
		t.Fatalf("join err = %v, want a MetadataConflict", err)
	}
	if want := []string{`model "sim-model" (kept "cli-model")`, "batch_size 4 (kept 16)"}; !slices.Equal(mc.Fields, want) {
		t.Errorf("conflicts %q, want %q", mc.Fields, want)
	}
	if !mc.StarterFound || mc.StarterConn != peer1.ConnID {
		t.Errorf("starter conn %d found %v, want %d", mc.StarterConn, mc.StarterFound, peer1.ConnID)
	}
	if wrapper.Start.Labels["exp"] != "" {
		t.Error("filling changed the caller's run_start")
	}
	// A second rank that agrees with the merged metadata joins quietly.
	if err := r.l.StartRun(r.now, Peer{ConnID: 3, PID: 102, UID: 1000}, &trainerproto.RunStart{Run: "a", Start: withMeta(&trainmeterv1.RunMetadata{Model: "cli-model", Dataset: "synthetic"})}); err != nil {
		t.Errorf("agreeing join: %v", err)
	}
	// The conflicting client joined: it may end the run.
	for _, p := range []Peer{peer1, peer2, {ConnID: 3, PID: 102, UID: 1000}} {
		if err := r.l.EndRun(r.now, p, &trainerproto.RunEnd{Run: "a"}); err != nil {
			t.Fatalf("end from conn %d: %v", p.ConnID, err)
		}
	}
	r.advance(2 * time.Second)
	var starts []*trainmeterv1.RunStart
	for _, b := range r.batches {
		for _, e := range b.RunEvents {
			if s := e.GetRunStart(); s != nil {
				starts = append(starts, s)
			}
		}
	}
	if len(starts) != 2 {
		t.Fatalf("%d run_start events, want the start and its filled copy", len(starts))
	}
	first, filled := starts[0], starts[1]
	if first.Metadata.Dataset != "" || first.Params != 0 {
		t.Errorf("first start already has dataset %q params %d", first.Metadata.Dataset, first.Params)
	}
	if !filled.Time.AsTime().Equal(start) || filled.Pid != uint32(peer1.PID) {
		t.Errorf("filled copy at %v pid %d, want the original start %v pid %d", filled.Time.AsTime(), filled.Pid, start, peer1.PID)
	}
	m := filled.Metadata
	if m.Model != "cli-model" || m.GetBatchSize() != 16 || m.Dataset != "synthetic" || m.SeqLen == nil || m.GetSeqLen() != 2048 || filled.Params != 124_000_000 {
		t.Errorf("filled metadata %+v params %d", m, filled.Params)
	}
	// num_workers 0 is a setting (the advisor starts from it), so the copy
	// says it was given.
	if first.NumWorkers != nil || filled.NumWorkers == nil || filled.GetNumWorkers() != 0 {
		t.Errorf("num_workers: first given %v, filled %d given %v; want the script's 0, given", first.NumWorkers != nil, filled.GetNumWorkers(), filled.NumWorkers != nil)
	}
	if filled.Labels["team"] != "nlp" || filled.Labels["exp"] != "7" {
		t.Errorf("filled labels %v, want the wrapper's team and the script's exp", filled.Labels)
	}
}

// Runs not started by `trainmeter run` still refuse a contradicting rank.
func TestPlainRunStillRefusesConflictingRank(t *testing.T) {
	r := attributedRig(t, false)
	r.advance(time.Second)
	if err := r.l.StartRun(r.now, peer1, &trainerproto.RunStart{Run: "p", Start: withMeta(&trainmeterv1.RunMetadata{Model: "a"})}); err != nil {
		t.Fatal(err)
	}
	err := r.l.StartRun(r.now, Peer{ConnID: 2, UID: 1000}, &trainerproto.RunStart{Run: "p", Start: withMeta(&trainmeterv1.RunMetadata{Model: "b"})})
	var mc *MetadataConflict
	if err == nil || errors.As(err, &mc) {
		t.Fatalf("err = %v, want a refusal", err)
	}
}

// withMeta is a run_start's Start carrying metadata md.
func withMeta(md *trainmeterv1.RunMetadata) *trainmeterv1.RunStart {
	return &trainmeterv1.RunStart{Metadata: md}
}
