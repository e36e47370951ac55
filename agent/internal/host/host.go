// Package host samples the host's memory and CPU use with gopsutil.
package host

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
	"sync"

	"github.com/shirou/gopsutil/v4/cpu"
	"github.com/shirou/gopsutil/v4/mem"
)

// Reading is one host sample.
type Reading struct {
	MemUsedMiB  float64
	MemTotalMiB float64
	// CPUPct is the busy share of all CPUs (0..100) since the previous Read
	// (since the Sampler was made, for the first Read).
	CPUPct   float64
	CPUCount int // logical CPUs
}

// Sampler reads the host. Read must not block for a sampling interval.
type Sampler interface {
	Read() (Reading, error)
}

const mib = 1 << 20

// Gopsutil is the gopsutil implementation of Sampler. CPU use is computed
// from the /proc/stat times between successive Reads of this Sampler, the
// same sum cpu.Percent(0, false) does, but without gopsutil's package-wide
// "last call" state, so two Samplers (or a library calling cpu.Percent)
// do not shorten each other's windows. It is safe for concurrent use.
type Gopsutil struct {
	mu    sync.Mutex
	last  cpu.TimesStat
	have  bool
	count int

	// hooks for tests
	times   func(context.Context) (cpu.TimesStat, error)
	virtual func(context.Context) (*mem.VirtualMemoryStat, error)
}

// NewGopsutil returns a Sampler over gopsutil. It takes the CPU baseline
// now, so the first Read reports use since this call.
func NewGopsutil() *Gopsutil {
	g := &Gopsutil{times: totalTimes, virtual: mem.VirtualMemoryWithContext}
	g.init()
	return g
}

func (g *Gopsutil) init() {
	if n, err := cpu.Counts(true); err == nil && n > 0 {
		g.count = n
	} else {
		g.count = runtime.NumCPU()
	}
	if t, err := g.times(context.Background()); err == nil {
		g.last, g.have = t, true
	}
}

func totalTimes(ctx context.Context) (cpu.TimesStat, error) {
	ts, err := cpu.TimesWithContext(ctx, false)
	if err != nil {
		return cpu.TimesStat{}, err
	}
	if len(ts) == 0 {
		return cpu.TimesStat{}, errors.New("no CPU times")
	}
	return ts[0], nil
}

// Read implements Sampler. Memory and CPU are read independently: if one
// fails the other is still returned, with the error.
func (g *Gopsutil) Read() (Reading, error) {
	ctx := context.Background()
	r := Reading{CPUCount: g.count}
	var memErr, cpuErr error
	if vm, err := g.virtual(ctx); err != nil {
		memErr = fmt.Errorf("host memory: %w", err)
	} else {
		r.MemUsedMiB, r.MemTotalMiB = float64(vm.Used)/mib, float64(vm.Total)/mib
	}
	if t, err := g.times(ctx); err != nil {
		cpuErr = fmt.Errorf("host cpu: %w", err)
	} else {
		g.mu.Lock()
		if g.have {
			r.CPUPct = busyPct(g.last, t)
		}
		g.last, g.have = t, true
		g.mu.Unlock()
	}
	return r, errors.Join(memErr, cpuErr)
}

// busyPct is the share of non-idle time between two readings of the CPU
// times, as gopsutil computes it.
func busyPct(a, b cpu.TimesStat) float64 {
	aAll, aBusy := allBusy(a)
	bAll, bBusy := allBusy(b)
	if bBusy <= aBusy {
		return 0
	}
	if bAll <= aAll {
		return 100
	}
	return math.Min(100, math.Max(0, (bBusy-aBusy)/(bAll-aAll)*100))
}

func allBusy(t cpu.TimesStat) (all, busy float64) {
	// The sum of every state (what gopsutil's deprecated TimesStat.Total
	// returns).
	all = t.User + t.System + t.Idle + t.Nice + t.Iowait + t.Irq + t.Softirq + t.Steal + t.Guest + t.GuestNice
	if runtime.GOOS == "linux" {
		// guest time is already counted in user/nice on Linux
		all -= t.Guest + t.GuestNice
	}
	return all, all - t.Idle - t.Iowait
}

var _ Sampler = (*Gopsutil)(nil)
