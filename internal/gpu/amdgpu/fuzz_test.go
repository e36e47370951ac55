package amdgpu_test

import (
	"testing"

	"github.com/trainmeter/trainmeter/internal/gpu/amdgpu"
)

// A gpu_metrics file is whatever the kernel (or a broken one) wrote: no
// input may panic the agent, and a table it accepts states its version.
func FuzzParseMetrics(f *testing.F) {
	for _, v := range [][2]uint8{{1, 0}, {1, 3}, {1, 5}, {3, 0}} {
		b, err := amdgpu.EncodeMetrics(amdgpu.MetricsSpec{Format: v[0], Content: v[1], EnergyRaw: 1 << 20, PowerW: 300, GfxBusyPct: 50})
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
		f.Add(b[:len(b)/2])
	}
	f.Add([]byte{})
	f.Add([]byte{4, 0, 9, 9})
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := amdgpu.ParseMetrics(b)
		if err != nil {
			return
		}
		if m.Version() == "" || m.PowerW < 0 || (m.GfxBusyOK && m.GfxBusyPct > 100) {
			t.Fatalf("accepted %x as %+v", b, m)
		}
	})
}
