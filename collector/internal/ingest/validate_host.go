package ingest

import (
	"fmt"

	"github.com/trainmeter/trainmeter/internal/batchcheck"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// Limits on a batch's host energy (RAPL) intervals: the agent sends about
// one a second, with a part per run on the node and per RAPL zone.
const (
	MaxHostEnergy       = 1000
	MaxHostEnergyShares = 1000
	MaxRAPLZones        = 256
)

// hostEnergyTolerance is how far the runs' and idle parts may sum above
// the node's energy (floating-point rounding of the split), relative.
const hostEnergyTolerance = 1e-9

// validateHostEnergy checks the host energy intervals: physical figures,
// start before end within the batch's reach, valid run ids, and parts that
// do not sum to more than the node's energy (conservation).
func validateHostEnergy(b *trainmeterv1.Batch) error {
	hs := b.GetHostEnergy()
	if len(hs) > MaxHostEnergy {
		return fmt.Errorf("%d host_energy intervals, more than %d", len(hs), MaxHostEnergy)
	}
	return each("host_energy", hs, func(h *trainmeterv1.HostEnergy) error { return validateOneHostEnergy(h, b) })
}

func validateOneHostEnergy(h *trainmeterv1.HostEnergy, b *trainmeterv1.Batch) error {
	if h == nil {
		return fmt.Errorf("is null")
	}
	if err := firstErr(batchcheck.Time("start", h.GetStart()), batchcheck.Time("end", h.GetEnd())); err != nil {
		return err
	}
	if !h.GetStart().AsTime().Before(h.GetEnd().AsTime()) {
		return fmt.Errorf("end is not after start")
	}
	if err := firstErr(inWindow("start", h.GetStart(), b), inWindow("end", h.GetEnd(), b)); err != nil {
		return err
	}
	if err := batchcheck.Phys("cpu_energy_j", h.GetCpuEnergyJ(), "dram_energy_j", h.GetDramEnergyJ(),
		"idle_cpu_energy_j", h.GetIdleCpuEnergyJ(), "idle_dram_energy_j", h.GetIdleDramEnergyJ()); err != nil {
		return err
	}
	if n := len(h.GetZones()); n > MaxRAPLZones {
		return fmt.Errorf("%d zones, more than %d", n, MaxRAPLZones)
	}
	for j, z := range h.GetZones() {
		if err := batchcheck.Phys(fmt.Sprintf("zones[%d].energy_j", j), z.GetEnergyJ()); err != nil {
			return err
		}
		if err := batchcheck.Text(fmt.Sprintf("zones[%d].name", j), z.GetName()); err != nil {
			return err
		}
	}
	if n := len(h.GetRuns()); n > MaxHostEnergyShares {
		return fmt.Errorf("%d run shares, more than %d", n, MaxHostEnergyShares)
	}
	cpu, dram := h.GetIdleCpuEnergyJ(), h.GetIdleDramEnergyJ()
	for j, s := range h.GetRuns() {
		if err := batchcheck.ID(fmt.Sprintf("runs[%d].run_id", j), s.GetRunId()); err != nil {
			return err
		}
		if err := batchcheck.Phys(fmt.Sprintf("runs[%d].cpu_energy_j", j), s.GetCpuEnergyJ(), fmt.Sprintf("runs[%d].dram_energy_j", j), s.GetDramEnergyJ(),
			fmt.Sprintf("runs[%d].share", j), s.GetShare(), fmt.Sprintf("runs[%d].cpu_s", j), s.GetCpuS()); err != nil {
			return err
		}
		if s.GetShare() > 1+hostEnergyTolerance {
			return fmt.Errorf("runs[%d].share %v is more than 1", j, s.GetShare())
		}
		if err := batchcheck.Text(fmt.Sprintf("runs[%d].split", j), s.GetSplit()); err != nil {
			return err
		}
		cpu += s.GetCpuEnergyJ()
		dram += s.GetDramEnergyJ()
	}
	if cpu > h.GetCpuEnergyJ()*(1+hostEnergyTolerance)+hostEnergyTolerance {
		return fmt.Errorf("runs + idle cpu energy (%v J) exceed the node's cpu_energy_j (%v J)", cpu, h.GetCpuEnergyJ())
	}
	if dram > h.GetDramEnergyJ()*(1+hostEnergyTolerance)+hostEnergyTolerance {
		return fmt.Errorf("runs + idle dram energy (%v J) exceed the node's dram_energy_j (%v J)", dram, h.GetDramEnergyJ())
	}
	return nil
}
