package amdgpu_test

import (
	"testing"
	"time"

	"github.com/trainmeter/trainmeter/pkg/gpu/amdgpu"
)

// BenchmarkProcessUsageRealProc is the once-a-second cost of per-process
// usage on this machine's /proc (every process's fdinfo is read), for one
// card of the MI300X fixture.
func BenchmarkProcessUsageRealProc(b *testing.B) {
	now := time.Unix(0, 0)
	be, err := amdgpu.New(amdgpu.Options{SysfsRoot: "testdata/mi300x/sys", ProcfsRoot: "/proc", Now: func() time.Time { return now }})
	if err != nil {
		b.Fatal(err)
	}
	defer be.Close()
	for b.Loop() {
		now = now.Add(time.Second) // every call rescans
		if _, err := be.ProcessUsage(0, time.Time{}); err != nil {
			b.Fatal(err)
		}
	}
}
