package report

import (
	"strings"
	"testing"
)

func TestHostEnergyColumnsAndReport(t *testing.T) {
	r := fullRun()
	for _, col := range []string{"cpu_energy_J", "dram_energy_J", "node_energy_J"} {
		if got := cell(t, r, col); got != "" {
			t.Errorf("%s = %q without host energy, want empty", col, got)
		}
	}
	var b strings.Builder
	if err := WriteReport(&b, r); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(b.String(), "host energy") {
		t.Errorf("host energy section without host energy:\n%s", b.String())
	}

	r.CpuEnergyJ, r.DramEnergyJ, r.NodeEnergyJ, r.HostEnergySplit = f64(31000.5), f64(4200.25), f64(240000+31000.5+4200.25), "cpu_time"
	for col, want := range map[string]string{"cpu_energy_J": "31000.5", "dram_energy_J": "4200.25", "node_energy_J": "275200.75"} {
		if got := cell(t, r, col); got != want {
			t.Errorf("%s = %q, want %s", col, got, want)
		}
	}
	b.Reset()
	if err := WriteReport(&b, r); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"host energy (CPU packages and DRAM, RAPL; whole run, the run's share of its nodes)\n",
		"  cpu:               31000.5 J\n", "  dram:              4200.2 J\n",
		"  node:              275200.8 J = GPUs 240000.0 J + cpu + dram\n",
		"  split:             cpu_time (the node's host energy shared with other runs)\n",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, b.String())
		}
	}
	// a node without a DRAM domain
	r.DramEnergyJ, r.HostEnergySplit = nil, "exclusive"
	b.Reset()
	_ = WriteReport(&b, r)
	if !strings.Contains(b.String(), "  dram:              - (no DRAM domain on the nodes: not in node energy)\n") || strings.Contains(b.String(), "split:") {
		t.Errorf("report without DRAM:\n%s", b.String())
	}
}
