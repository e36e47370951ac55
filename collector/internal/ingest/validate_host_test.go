package ingest

import (
	"math"
	"strings"
	"testing"

	"github.com/trainmeter/trainmeter/collector/internal/testutil"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

func hostBatch(mutate func(h *trainmeterv1.HostEnergy)) *trainmeterv1.Batch {
	b := testutil.Batch(1, 10, nil)
	h := &trainmeterv1.HostEnergy{
		Start: testutil.TS(9.2), End: testutil.TS(10.2), CpuEnergyJ: 100, DramEnergyJ: 10, DramOk: true,
		Zones: []*trainmeterv1.RaplZoneEnergy{{Socket: 0, Domain: "package", Name: "package-0", EnergyJ: 100}, {Socket: 0, Domain: "dram", Name: "dram", EnergyJ: 10}},
		Runs: []*trainmeterv1.HostEnergyShare{
			{RunId: "a", CpuEnergyJ: 60, DramEnergyJ: 6, Share: 0.6, Split: "cpu_time"},
			{RunId: "b", CpuEnergyJ: 30, DramEnergyJ: 3, Share: 0.3, Split: "cpu_time"},
		},
		IdleCpuEnergyJ: 10, IdleDramEnergyJ: 1,
	}
	if mutate != nil {
		mutate(h)
	}
	b.HostEnergy = []*trainmeterv1.HostEnergy{h}
	return b
}

func TestValidateHostEnergy(t *testing.T) {
	if err := ValidateBatch(hostBatch(nil)); err != nil {
		t.Fatalf("a good interval refused: %v", err)
	}
	for name, c := range map[string]struct {
		mutate func(*trainmeterv1.HostEnergy)
		want   string
	}{
		"NaN cpu":         {func(h *trainmeterv1.HostEnergy) { h.CpuEnergyJ = math.NaN() }, "cpu_energy_j is not finite"},
		"negative share":  {func(h *trainmeterv1.HostEnergy) { h.Runs[0].CpuEnergyJ = -1 }, "runs[0].cpu_energy_j is negative"},
		"end before":      {func(h *trainmeterv1.HostEnergy) { h.End = testutil.TS(9) }, "end is not after start"},
		"no start":        {func(h *trainmeterv1.HostEnergy) { h.Start = nil }, "start is missing"},
		"empty run id":    {func(h *trainmeterv1.HostEnergy) { h.Runs[1].RunId = "" }, "runs[1].run_id is empty"},
		"more than node":  {func(h *trainmeterv1.HostEnergy) { h.Runs[0].CpuEnergyJ = 95 }, "exceed the node's cpu_energy_j"},
		"dram over node":  {func(h *trainmeterv1.HostEnergy) { h.IdleDramEnergyJ = 5 }, "exceed the node's dram_energy_j"},
		"share over one":  {func(h *trainmeterv1.HostEnergy) { h.Runs[0].Share = 2 }, "share 2 is more than 1"},
		"far in the past": {func(h *trainmeterv1.HostEnergy) { h.Start = testutil.TS(-1e8) }, "before the batch window"},
	} {
		err := ValidateBatch(hostBatch(c.mutate))
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "host_energy[0]") {
			t.Errorf("%s: err = %v, want %q", name, err, c.want)
		}
	}
}
