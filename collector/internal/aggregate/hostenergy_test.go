package aggregate

import (
	"testing"

	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

func hostInterval(from, to float64, dramOK bool, shares ...*trainmeterv1.HostEnergyShare) *trainmeterv1.HostEnergy {
	return &trainmeterv1.HostEnergy{Start: ts(from), End: ts(to), DramOk: dramOK, Runs: shares}
}

// cpu_energy_J and dram_energy_J are the sums of the run's shares over its
// nodes; node_energy_J adds the GPUs' whole-run energy; all survive the
// store's encoding.
func TestHostEnergySumsSharesAcrossNodes(t *testing.T) {
	s := fold([]ev{start("a", 0, "m", 2), win("a", 0, 10, true, 1000, 990, 100, 10, 0), end("a", 10)})
	if r := s.Report(Pricing{}); r.CpuEnergyJ != nil || r.DramEnergyJ != nil || r.NodeEnergyJ != nil {
		t.Fatalf("host energy without any host interval: %v %v %v", r.CpuEnergyJ, r.DramEnergyJ, r.NodeEnergyJ)
	}
	s.AddHostEnergy("a", hostInterval(0, 1, true), &trainmeterv1.HostEnergyShare{RunId: "r1", CpuEnergyJ: 120, DramEnergyJ: 20, Split: "exclusive"})
	s.AddHostEnergy("b", hostInterval(0, 1, true), &trainmeterv1.HostEnergyShare{RunId: "r1", CpuEnergyJ: 60.5, DramEnergyJ: 9.5, Split: "cpu_time"})
	// a node without DRAM domain: its dram part is not valid
	s.AddHostEnergy("c", hostInterval(0, 1, false), &trainmeterv1.HostEnergyShare{RunId: "r1", CpuEnergyJ: 30, DramEnergyJ: 99, Split: "exclusive"})

	b, err := s.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	back, err := Unmarshal(b)
	if err != nil {
		t.Fatal(err)
	}
	r := back.Report(Pricing{})
	if r.GetCpuEnergyJ() != 210.5 || r.GetDramEnergyJ() != 29.5 {
		t.Fatalf("cpu %v dram %v, want 210.5 and 29.5", r.GetCpuEnergyJ(), r.GetDramEnergyJ())
	}
	if r.GetNodeEnergyJ() != r.GetEnergyTotalJ()+210.5+29.5 || r.GetEnergyTotalJ() != 1000 {
		t.Fatalf("node %v, GPUs %v", r.GetNodeEnergyJ(), r.GetEnergyTotalJ())
	}
	if r.GetHostEnergySplit() != "cpu_time" {
		t.Fatalf("split %q", r.GetHostEnergySplit())
	}
}

func TestHostEnergyWithoutDRAMAnywhere(t *testing.T) {
	s := fold([]ev{start("a", 0, "m", 2), win("a", 0, 10, true, 1000, 990, 100, 10, 0), end("a", 10)})
	s.AddHostEnergy("a", hostInterval(0, 1, false), &trainmeterv1.HostEnergyShare{RunId: "r1", CpuEnergyJ: 50, Split: "exclusive"})
	r := s.Report(Pricing{})
	if r.DramEnergyJ != nil {
		t.Fatalf("dram %v on a node without a dram domain", r.GetDramEnergyJ())
	}
	if r.GetNodeEnergyJ() != 1050 || r.GetHostEnergySplit() != "exclusive" {
		t.Fatalf("node %v split %q", r.GetNodeEnergyJ(), r.GetHostEnergySplit())
	}
}
