package store

import (
	"errors"
	"testing"
	"time"

	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"

	"github.com/trainmeter/trainmeter/pkg/clock"
)

func hostPart(from, to int, cpu float64, runs ...string) *trainmeterv1.HostEnergy {
	h := &trainmeterv1.HostEnergy{Start: ts(from), End: ts(to), CpuEnergyJ: cpu, DramEnergyJ: cpu / 10, DramOk: true}
	for _, r := range runs {
		h.Runs = append(h.Runs, &trainmeterv1.HostEnergyShare{RunId: r, CpuEnergyJ: cpu / float64(len(runs)),
			DramEnergyJ: cpu / 10 / float64(len(runs)), Share: 1 / float64(len(runs)), Split: "equal"})
	}
	return h
}

// A run's host energy parts are folded into its aggregate whenever they
// come, its last one after the batch with its end included; a run deleted
// while live does not come back through its host energy.
func TestHostEnergyFoldedAndDeletedRunsStayDeleted(t *testing.T) {
	s, err := Open(t.TempDir(), Options{Logger: quiet(), Clock: clock.NewFake(t0.Add(5 * time.Second))})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	apply := func(b *trainmeterv1.Batch) {
		t.Helper()
		if _, err := s.ApplyBatch("n1", "boot", b); err != nil {
			t.Fatal(err)
		}
	}
	b := batch(1, "a", 0, 10, 100, startEv("a", 0), startEv("gone", 0))
	b.HostEnergy = []*trainmeterv1.HostEnergy{hostPart(0, 1, 80, "a", "gone")}
	apply(b)
	if _, err := s.DeleteLiveRun("gone"); err != nil {
		t.Fatal(err)
	}
	b = batch(2, "a", 1, 10, 100, &trainmeterv1.RunEvent{Event: &trainmeterv1.RunEvent_RunEnd{RunEnd: &trainmeterv1.RunEnd{RunId: "a", Time: ts(2)}}})
	apply(b)
	b = batch(3, "other", 3, 10, 100, startEv("other", 3))
	b.HostEnergy = []*trainmeterv1.HostEnergy{hostPart(1, 2, 60, "a", "gone")} // a's last interval, after its end's batch
	apply(b)
	st, err := s.GetRun("a")
	if err != nil {
		t.Fatal(err)
	}
	if !st.HasHostCpu || st.HostCpuEnergyJ != 40+30 || st.HostDramEnergyJ != 4+3 {
		t.Fatalf("a's host energy: cpu %v dram %v (%v)", st.HostCpuEnergyJ, st.HostDramEnergyJ, st.HasHostCpu)
	}
	if _, err := s.GetRun("gone"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("the deleted run came back through its host energy: %v", err)
	}
}
