package agent

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/trainmeter/trainmeter/agent/internal/ledger"
	"github.com/trainmeter/trainmeter/agent/internal/rapl"
)

// Host energy: the node's CPU package and DRAM energy from the RAPL
// counters (agent/internal/rapl), read every --host-interval off the GPU sampling
// path and split between runs by the ledger (docs/measurement.md, "Host
// energy (CPU and DRAM)"). While two or more runs are on the node, each
// read also sums the CPU time of every run's process tree from procfs.

// userHZ is the unit of /proc/PID/stat's CPU times (USER_HZ, 100 on every
// Linux architecture the agent is built for); only ratios of them are
// used, so a different value would change nothing but cpu_s.
const userHZ = 100

// hostEnergy is the agent's RAPL reader and what GET /status says of it.
type hostEnergy struct {
	reader *rapl.Reader
	reads  atomic.Uint64 // reads with every package (and dram) zone read

	mu     sync.Mutex
	status string // "ok: ...", or why the counters are not read
	failed bool   // the last read failed (logged once until it recovers)
}

// openHostEnergy finds the RAPL counters under the sysfs root. Their
// absence (a VM, no powercap driver) only turns host energy off.
func (a *Agent) openHostEnergy(readFile rapl.ReadFileFunc) {
	a.hostEnergy = &hostEnergy{}
	if a.cfg.SysfsRoot == "" {
		a.hostEnergy.status = "off: no sysfs root"
		return
	}
	r, err := rapl.Open(a.cfg.SysfsRoot, readFile)
	if err != nil {
		a.hostEnergy.status = "no RAPL counters: " + err.Error()
		a.log.Info("host CPU/DRAM energy not measured: no RAPL counters (cpu_energy_J and dram_energy_J stay empty)", "sysfs_root", a.cfg.SysfsRoot, "err", err)
		return
	}
	a.hostEnergy.reader = r
	a.hostEnergy.status = "ok: " + describeZones(r.Zones())
	// Read once now: a refusal shows in the log and the Hello at start,
	// and the first interval can start at the first tick.
	a.pollHostEnergy()
}

// describeZones says what the node's RAPL measures: "2 sockets, package
// and dram".
func describeZones(zones []rapl.Zone) string {
	sockets := map[int]bool{}
	var domains []string
	for _, z := range zones {
		if z.Domain == rapl.DomainPackage {
			sockets[z.Socket] = true
		}
		if (z.Domain == rapl.DomainPackage || z.Domain == rapl.DomainDRAM) && !slices.Contains(domains, z.Domain) {
			domains = append(domains, z.Domain)
		}
	}
	s := fmt.Sprintf("%d socket(s), %s", len(sockets), strings.Join(domains, " and "))
	if !slices.Contains(domains, rapl.DomainDRAM) {
		s += " (no dram domain: dram_energy_J stays empty)"
	}
	return s
}

// pollHostEnergy reads the counters and hands the point to the ledger.
func (a *Agent) pollHostEnergy() {
	he := a.hostEnergy
	if he == nil || he.reader == nil {
		return
	}
	now := a.clock.Now()
	rd, _ := he.reader.Read()
	err := rd.SummedErr()
	if _, cpuOK := rd.Sum(rapl.DomainPackage); err == nil && !cpuOK {
		err = errors.New("no package zone")
	}
	he.mu.Lock()
	if err != nil {
		denied := errors.Is(err, rapl.ErrPermission)
		switch {
		case he.failed:
		case denied:
			a.log.Warn("RAPL energy counters not readable (permission denied): cpu_energy_J and dram_energy_J stay empty until they are; logged again when they are read", "hint", rapl.PermissionFix("trainmeter"), "err", err)
		default:
			a.log.Warn("RAPL energy counters not read; logged again when they are", "err", err)
		}
		he.failed = true
		he.status = "error: " + err.Error()
		if denied {
			he.status = "permission denied: " + err.Error()
		}
		he.mu.Unlock()
		return
	}
	if he.failed {
		a.log.Info("RAPL energy counters read again")
		he.failed = false
		he.status = "ok: " + describeZones(he.reader.Zones())
	}
	he.mu.Unlock()
	p := ledger.HostPoint{T: now}
	for _, z := range rd.Zones {
		p.Zones = append(p.Zones, ledger.HostZone{Socket: z.Socket, Domain: z.Domain, Name: z.Name, EnergyUJ: z.EnergyUJ})
		switch z.Domain {
		case rapl.DomainPackage:
			p.CPUUJ += z.EnergyUJ
		case rapl.DomainDRAM:
			p.DRAMUJ += z.EnergyUJ
			p.DRAMOK = true
		}
	}
	if runs := a.ledger.SharedRuns(now); len(runs) >= 2 {
		p.RunCPU = treeCPU(a.cfg.ProcfsRoot, runs)
	}
	a.ledger.AddHostPoint(p)
	he.reads.Add(1)
}

// hostEnergyStatus is what the Hello and GET /status say.
func (a *Agent) hostEnergyStatus() (status string, reads uint64) {
	he := a.hostEnergy
	if he == nil {
		return "", 0
	}
	he.mu.Lock()
	defer he.mu.Unlock()
	return he.status, he.reads.Load()
}

// procStat is what treeCPU needs of /proc/PID/stat.
type procStat struct {
	ppid int
	// ticks is utime + stime + cutime + cstime: the process's CPU time and
	// that of its children it has waited for (gone from the table, so never
	// counted twice).
	ticks uint64
}

// treeCPU sums, for each run, the CPU seconds of the process trees rooted
// at its known processes (`trainmeter run`'s PID, the ranks' socket peers)
// as procRoot shows them now. A run none of whose roots is found is left
// out (its CPU time unknown).
func treeCPU(procRoot string, runs []ledger.SharedRun) map[string]float64 {
	if procRoot == "" {
		procRoot = "/proc"
	}
	entries, err := os.ReadDir(procRoot)
	if err != nil {
		return nil
	}
	procs := map[int]procStat{}
	children := map[int][]int{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, err := readProcStat(procRoot, pid)
		if err != nil {
			continue // gone since the listing
		}
		procs[pid] = st
		children[st.ppid] = append(children[st.ppid], pid)
	}
	out := map[string]float64{}
	for _, r := range runs {
		seen := map[int]bool{}
		var ticks uint64
		stack := append([]int(nil), r.Roots...)
		for len(stack) > 0 {
			pid := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			st, ok := procs[pid]
			if !ok || seen[pid] {
				continue
			}
			seen[pid] = true
			ticks += st.ticks
			stack = append(stack, children[pid]...)
		}
		if len(seen) > 0 {
			out[r.ID] = float64(ticks) / userHZ
		}
	}
	return out
}

// readProcStat reads ppid and the CPU times from procRoot/PID/stat.
func readProcStat(procRoot string, pid int) (procStat, error) {
	f, err := statFields(procRoot, pid, 15) // state(3) ppid(4) ... utime(14) stime(15) cutime(16) cstime(17)
	if err != nil {
		return procStat{}, err
	}
	ppid, err := strconv.Atoi(string(f[1]))
	if err != nil {
		return procStat{}, fmt.Errorf("%d/stat: ppid: %w", pid, err)
	}
	var ticks uint64
	for _, k := range []int{11, 12, 13, 14} {
		v, err := strconv.ParseInt(string(f[k]), 10, 64)
		if err != nil {
			return procStat{}, fmt.Errorf("%d/stat: field %d: %w", pid, k+3, err)
		}
		if v > 0 {
			ticks += uint64(v)
		}
	}
	return procStat{ppid: ppid, ticks: ticks}, nil
}
