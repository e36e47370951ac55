package amdgpu

import (
	"bufio"
	"cmp"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/trainmeter/trainmeter/pkg/gpu"
)

// DRM clients in /proc/PID/fdinfo (the kernel's
// Documentation/gpu/drm-usage-stats.rst): each open amdgpu DRM file shows
// drm-pdev (the card's PCI address), drm-client-id (shared by duplicated
// fds and forked children), drm-engine-gfx (ns the engine was busy for the
// client) and drm-memory-vram. Another user's fdinfo needs ptrace access
// (same uid or CAP_SYS_PTRACE): processes the agent may not inspect are
// skipped, as NVML skips what it cannot see.

type drmClient struct {
	pid      uint32
	id       string
	pdev     string
	engineNs uint64
	engineOK bool
	vramMiB  float64
	vramOK   bool
}

type clientSeen struct {
	engineNs uint64
	at       time.Time
}

// scanClients lists the amdgpu DRM clients of every process under procfs,
// one per client id (the lowest pid that holds it).
func scanClients(procfs string) ([]drmClient, error) {
	ents, err := os.ReadDir(procfs)
	if err != nil {
		return nil, err
	}
	byID := map[string]drmClient{}
	for _, e := range ents {
		pid, err := strconv.ParseUint(e.Name(), 10, 32)
		if err != nil {
			continue
		}
		for _, fd := range drmFDs(filepath.Join(procfs, e.Name())) {
			c, ok := readClient(filepath.Join(procfs, e.Name(), "fdinfo", fd))
			if !ok {
				continue
			}
			c.pid = uint32(pid)
			key := c.pdev + "/" + c.id
			if prev, seen := byID[key]; seen && prev.pid <= c.pid {
				continue
			}
			byID[key] = c
		}
	}
	return slices.SortedFunc(maps.Values(byID), func(a, b drmClient) int {
		return cmp.Or(cmp.Compare(a.pid, b.pid), strings.Compare(a.id, b.id))
	}), nil
}

// drmFDs lists the fds of process dir whose fd/N link points into /dev/dri
// (a readlink is much cheaper than reading every fdinfo of a process with
// hundreds of fds). Where fd/ cannot be listed but fdinfo/ can (a fixture
// tree), every fd is a candidate.
func drmFDs(dir string) []string {
	fds, err := os.ReadDir(filepath.Join(dir, "fd"))
	if err != nil {
		all, err := os.ReadDir(filepath.Join(dir, "fdinfo"))
		if err != nil {
			return nil // gone, or not ours to inspect
		}
		names := make([]string, len(all))
		for i, e := range all {
			names[i] = e.Name()
		}
		return names
	}
	var out []string
	for _, e := range fds {
		if target, err := os.Readlink(filepath.Join(dir, "fd", e.Name())); err == nil && strings.HasPrefix(target, "/dev/dri/") {
			out = append(out, e.Name())
		}
	}
	return out
}

// readClient parses one fdinfo file; ok is false for anything but an
// amdgpu DRM client.
func readClient(path string) (drmClient, bool) {
	f, err := os.Open(path)
	if err != nil {
		return drmClient{}, false
	}
	defer f.Close()
	var c drmClient
	amd := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		v = strings.TrimSpace(v)
		switch k {
		case "drm-driver":
			amd = v == "amdgpu"
		case "drm-pdev":
			c.pdev = v
		case "drm-client-id":
			c.id = v
		case "drm-engine-gfx":
			num, _, _ := strings.Cut(v, " ")
			if n, err := strconv.ParseUint(num, 10, 64); err == nil {
				c.engineNs, c.engineOK = n, true
			}
		case "drm-memory-vram":
			c.vramMiB, c.vramOK = parseSize(v)
		case "drm-resident-vram":
			if !c.vramOK {
				c.vramMiB, c.vramOK = parseSize(v)
			}
		}
	}
	return c, amd && c.id != ""
}

// scanReuse is how long one scan of procfs serves the per-card calls: the
// agent asks card by card, once a second, and one scan reads every
// process's fdinfo for all cards at once.
const scanReuse = 250 * time.Millisecond

// clientsOf lists card index's DRM clients; the caller holds b.pmu.
func (b *Backend) clientsOf(index int) (*device, []drmClient, error) {
	if index < 0 || index >= len(b.gpus) {
		return nil, nil, fmt.Errorf("amdgpu: no GPU %d", index)
	}
	now := b.opt.Clock.Now()
	all := b.scan
	if b.scanAt.IsZero() || now.Sub(b.scanAt) >= scanReuse || now.Before(b.scanAt) {
		var err error
		if all, err = scanClients(b.opt.ProcfsRoot); err != nil {
			return nil, nil, fmt.Errorf("amdgpu: fdinfo: %w", err)
		}
		b.scan, b.scanAt = all, now
	}
	d := b.gpus[index]
	var out []drmClient
	for _, c := range all {
		if c.pdev == d.card.PCI || (c.pdev == "" && len(b.gpus) == 1) {
			out = append(out, c)
		}
	}
	return d, out, nil
}

// ComputePIDs implements gpu.ProcessLister: the processes that hold an
// amdgpu DRM client of card index.
func (b *Backend) ComputePIDs(index int) ([]uint32, error) {
	b.pmu.Lock()
	defer b.pmu.Unlock()
	_, cs, err := b.clientsOf(index)
	if err != nil {
		return nil, err
	}
	var pids []uint32
	for _, c := range cs {
		if len(pids) == 0 || pids[len(pids)-1] != c.pid {
			pids = append(pids, c.pid)
		}
	}
	return pids, nil
}

// ProcessUsage implements gpu.ProcessUsageReader from fdinfo: each
// process's VRAM, and its engine busy share since the previous poll
// (drm-engine-gfx is cumulative, so since is not needed). A client seen
// for the first time has memory but no utilisation yet.
func (b *Backend) ProcessUsage(index int, _ time.Time) (map[uint32]gpu.ProcessUse, error) {
	b.pmu.Lock()
	defer b.pmu.Unlock()
	now := b.opt.Clock.Now()
	d, cs, err := b.clientsOf(index)
	if err != nil {
		return nil, err
	}
	seen := make(map[string]clientSeen, len(cs))
	out := map[uint32]gpu.ProcessUse{}
	for _, c := range cs {
		u := out[c.pid]
		if c.vramOK {
			u.MemMiB += c.vramMiB
			u.MemOK = true
		}
		if c.engineOK {
			if prev, ok := d.clients[c.id]; ok && now.After(prev.at) && c.engineNs >= prev.engineNs {
				pct := 100 * float64(c.engineNs-prev.engineNs) / float64(now.Sub(prev.at).Nanoseconds())
				u.SMPct += min(pct, 100)
				u.SMOK = true
			}
			seen[c.id] = clientSeen{engineNs: c.engineNs, at: now}
		}
		out[c.pid] = u
	}
	d.clients = seen
	return out, nil
}

// FdinfoAccess counts the processes under procfs whose fdinfo this process
// may read and those it may not, for doctor.
func FdinfoAccess(procfs string) (readable, denied int, err error) {
	ents, err := os.ReadDir(procfs)
	if err != nil {
		return 0, 0, err
	}
	for _, e := range ents {
		if _, err := strconv.ParseUint(e.Name(), 10, 32); err != nil {
			continue
		}
		_, err := os.ReadDir(filepath.Join(procfs, e.Name(), "fdinfo"))
		switch {
		case err == nil:
			readable++
		case os.IsPermission(err):
			denied++
		}
	}
	return readable, denied, nil
}
