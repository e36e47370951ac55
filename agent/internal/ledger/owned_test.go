package ledger

import (
	"slices"
	"testing"
	"time"

	"github.com/trainmeter/trainmeter/agent/internal/trainerproto"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// ownerStart is the run_start the agent sends for an owner of GPU processes.
func ownerStart(id string, gpus ...string) *trainerproto.RunStart {
	return &trainerproto.RunStart{Run: id, GPUs: gpus, WarmupS: ptr(0.0), Resume: true,
		Start: &trainmeterv1.RunStart{Metadata: &trainmeterv1.RunMetadata{}, Attribution: "slurm", Labels: map[string]string{"slurm.account": "physics"}}}
}

// A job's run that a trainer of the job joins: the trainer fills the
// metadata, its tree is not a trainer's run apart (TrainerRoots), the run
// lives on after the trainer's run_end, and ends with the job's status
// (the first that is not ok).
func TestOwnerRunJoinedByATrainer(t *testing.T) {
	r := newRig(t, []float64{300, 200}, []float64{300, 200}, 0)
	r.advance(time.Second)
	owner := Peer{ConnID: 1 << 62, PID: 500, UID: 1000}
	if err := r.l.StartRun(r.at(10*time.Millisecond), owner, ownerStart("slurm-c-7", "1")); err != nil {
		t.Fatal(err)
	}
	trainer := Peer{ConnID: 3, PID: 501, UID: 1000}
	model := "m"
	if err := r.l.StartRun(r.at(20*time.Millisecond), trainer, &trainerproto.RunStart{Run: "slurm-c-7", ClientID: "c", GPUs: []string{"1"},
		Start: &trainmeterv1.RunStart{Metadata: &trainmeterv1.RunMetadata{Model: model}, Attribution: "run"}}); err != nil {
		t.Fatal(err)
	}
	if roots := r.l.TrainerRoots(); len(roots) != 0 {
		t.Errorf("TrainerRoots = %v: the job's run is no trainer's run apart", roots)
	}
	r.advance(time.Second)
	if err := r.l.EndRun(r.at(0), trainer, &trainerproto.RunEnd{Run: "slurm-c-7"}); err != nil {
		t.Fatal(err)
	}
	if !r.l.Live("slurm-c-7") {
		t.Fatal("the job's run ended with its trainer")
	}
	r.advance(time.Second)
	if err := r.l.EndOwned(r.at(0), owner, "slurm-c-7", "exit 3", "", "the slurm job ended"); err != nil {
		t.Fatal(err)
	}
	r.advance(2 * time.Second)
	starts, ends := r.starts("slurm-c-7"), r.ends("slurm-c-7")
	if len(starts) < 2 || starts[0].GetAttribution() != "slurm" || starts[len(starts)-1].GetMetadata().GetModel() != model ||
		starts[0].GetLabels()["slurm.account"] != "physics" || starts[0].GetWarmupS() != 0 {
		t.Errorf("starts %v", starts)
	}
	if len(ends) != 1 || ends[0].GetEndStatus() != "exit 3" || ends[0].GetReason() != "the slurm job ended" {
		t.Errorf("ends %v", ends)
	}
	for _, w := range r.windows("slurm-c-7") {
		if !slices.Equal(w.GetGpus(), []uint32{1}) {
			t.Errorf("window on GPUs %v, want [1]", w.GetGpus())
		}
	}
}

// SetGPUs replaces an owner's GPU set (a GPU its processes left is idle)
// and leaves trainers' runs alone; EndOwned with no status ends a run
// nobody ended as lost.
func TestOwnerRunGPUsFollowItsProcesses(t *testing.T) {
	r := newRig(t, []float64{300, 200}, []float64{300, 200}, 0)
	r.advance(time.Second)
	owner := Peer{ConnID: 1 << 62, PID: 600, UID: 1000}
	if err := r.l.StartRun(r.at(0), owner, ownerStart("proc-n-1000-600-1", "0", "1")); err != nil {
		t.Fatal(err)
	}
	if err := r.l.StartRun(r.at(0), peer1, &trainerproto.RunStart{Run: "t", GPUs: []string{"0"}, Start: &trainmeterv1.RunStart{Attribution: "run"}}); err != nil {
		t.Fatal(err)
	}
	r.advance(time.Second)
	left := r.at(500 * time.Millisecond)
	r.l.SetGPUs(left, "proc-n-1000-600-1", []int{0})
	r.l.SetGPUs(left, "t", nil) // a trainer's run: untouched
	r.advance(time.Second)
	if err := r.l.EndOwned(r.at(0), owner, "proc-n-1000-600-1", "", "", "gone"); err != nil {
		t.Fatal(err)
	}
	r.advance(2 * time.Second)
	for _, w := range r.windows("proc-n-1000-600-1") {
		want := []uint32{0, 1}
		if !w.GetStart().AsTime().Before(left) {
			want = []uint32{0}
		}
		if !slices.Equal(w.GetGpus(), want) {
			t.Errorf("window %v-%v on GPUs %v, want %v", w.GetStart().AsTime(), w.GetEnd().AsTime(), w.GetGpus(), want)
		}
	}
	if ends := r.ends("proc-n-1000-600-1"); len(ends) != 1 || ends[0].GetEndStatus() != "lost" {
		t.Errorf("ends %v", ends)
	}
	if roots := r.l.TrainerRoots(); !slices.Equal(roots, []int{int(peer1.PID)}) {
		t.Errorf("TrainerRoots = %v, want the trainer's %d", roots, peer1.PID)
	}
}
