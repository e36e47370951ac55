package agent

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/trainmeter/trainmeter/agent/internal/gpu/simgpu"
	"github.com/trainmeter/trainmeter/agent/internal/owner"
	"github.com/trainmeter/trainmeter/pkg/clock"
)

// ownedProc is one fixture process: its user and process group.
type ownedProc struct{ uid, pgid int }

// ownedFixture writes PID/stat, status and cgroup files as /proc has them.
func ownedFixture(t *testing.T, dir string, pid int, p ownedProc) {
	t.Helper()
	d := filepath.Join(dir, strconv.Itoa(pid))
	if err := os.MkdirAll(d, 0o755); err != nil {
		t.Fatal(err)
	}
	// state ppid pgrp session tty tpgid flags minflt cminflt majflt
	// cmajflt utime stime cutime cstime priority nice threads itreal
	// starttime ...
	stat := fmt.Sprintf("%d (train (x)) S 1 %d %d 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 %d 0 0\n", pid, p.pgid, p.pgid, 1000+pid)
	files := map[string]string{"stat": stat, "status": fmt.Sprintf("Name:\ttrain\nUid:\t%d\t%d\t%d\t%d\n", p.uid, p.uid, p.uid, p.uid), "cgroup": "0::/user.slice\n"}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(d, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// jobSource is a scheduler source for tests: the PIDs in jobs belong to
// the job named, and the jobs in alloc hold those GPUs; a job ends once
// none of its processes is on a GPU and it holds none.
type jobSource struct {
	mu    sync.Mutex
	jobs  map[int]string   // pid -> job
	alloc map[string][]int // job -> the GPUs allocated to it
}

func jobOwner(j string) owner.Owner {
	return owner.Owner{Source: owner.AttrSlurm, RunID: "slurm-test-" + j, UID: 4242, Persistent: true,
		Labels: map[string]string{"slurm.account": "acct-" + j, "slurm.job_id": j}}
}

func (s *jobSource) Allocated(_ time.Time, _ []owner.Device) []owner.Allocation {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []owner.Allocation
	for j, gs := range s.alloc {
		out = append(out, owner.Allocation{Owner: jobOwner(j), GPUs: gs})
	}
	return out
}

func (s *jobSource) Name() string { return owner.AttrSlurm }

func (s *jobSource) Owners(procs []owner.Process) map[int]owner.Owner {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[int]owner.Owner{}
	for _, p := range procs {
		if j, ok := s.jobs[p.PID]; ok {
			out[p.PID] = jobOwner(j)
		}
	}
	return out
}

func (s *jobSource) Ended(o owner.Owner) (owner.End, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.alloc[o.Labels["slurm.job_id"]] != nil {
		return owner.End{}, false
	}
	return owner.End{Status: "exit 0"}, true
}

// gatedLister lists processes only while the test polls (open): the
// agent's own once-a-second poll, which runs whenever its goroutine gets to
// it, would otherwise read the listing in the middle of the test changing
// it and act on it at a later fake time. Refused, that poll changes nothing.
type gatedLister struct {
	*listingSim
	open atomic.Bool
}

func (g *gatedLister) ComputePIDs(i int) ([]uint32, error) {
	if !g.open.Load() {
		return nil, errors.New("closed")
	}
	return g.listingSim.ComputePIDs(i)
}

// Random arrivals and departures of GPU processes of Slurm jobs and of
// plain users' process groups on three GPUs, and of jobs' GPU allocations
// (a job holding a GPU with no process on it), each second for a minute:
// every GPU-second of every window is in exactly one row (a run's share of
// the GPU or its idle), and a GPU is idle exactly while no process is on it
// and no live job used it or holds it.
func TestEveryGPUSecondInExactlyOneRow(t *testing.T) {
	for seed := range uint64(3) {
		t.Run(strconv.FormatUint(seed, 10), func(t *testing.T) { everyGPUSecond(t, seed) })
	}
}

func everyGPUSecond(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 32))
	rec, collectorAddr := startRecorder(t)
	const nGPU = 3
	backend := &gatedLister{listingSim: &listingSim{Backend: simgpu3(), pids: map[int][]uint32{}}}
	fake := clock.NewFake(time.Date(2026, 11, 27, 10, 0, 0, 0, time.UTC))
	cfg := DefaultConfig()
	cfg.Collector = collectorAddr
	cfg.Socket = filepath.Join(t.TempDir(), "agent.sock")
	cfg.Spool = filepath.Join(t.TempDir(), "spool")
	cfg.Node = "prop-node"
	cfg.GPU = "nvml"
	a, err := New(cfg, backend, fake, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	a.procRoot = dir
	jobs := &jobSource{jobs: map[int]string{}, alloc: map[string][]int{}}
	a.owned.sources = []owner.Source{jobs}
	if err := a.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = a.Shutdown(ctx)
	}()

	on := map[int]map[uint32]bool{} // GPU -> PIDs on it
	for g := range nGPU {
		on[g] = map[uint32]bool{}
	}
	nextPID := 100
	var busyS [nGPU]float64              // seconds the GPU was someone's
	jobGPUs := map[string]map[int]bool{} // live job -> the GPUs it used
	const steps = 60
	for range steps {
		for g := range nGPU {
			for pid := range on[g] {
				if rng.IntN(4) == 0 {
					delete(on[g], pid) // the process left the GPU
				}
			}
			if rng.IntN(3) == 0 {
				pid := nextPID
				nextPID++
				// A job's process, or a user's (three users, a few process
				// groups each: some groups span GPUs and come back).
				p := ownedProc{uid: 1000 + rng.IntN(3), pgid: 50 + rng.IntN(4)}
				ownedFixture(t, dir, pid, p)
				if rng.IntN(3) == 0 {
					jobs.mu.Lock()
					jobs.jobs[pid] = strconv.Itoa(rng.IntN(3))
					jobs.mu.Unlock()
				}
				on[g][uint32(pid)] = true
			}
			var pids []uint32
			for pid := range on[g] {
				pids = append(pids, pid)
			}
			backend.set(g, pids...)
		}
		// A job is allocated a GPU, or gives its GPUs back.
		jobs.mu.Lock()
		if rng.IntN(3) == 0 {
			j := strconv.Itoa(rng.IntN(3))
			if jobs.alloc[j] != nil {
				delete(jobs.alloc, j)
			} else {
				jobs.alloc[j] = []int{rng.IntN(nGPU)}
			}
		}
		jobs.mu.Unlock()
		// A GPU is busy while a process is on it, while a job that had
		// one on it lives (has a process on any GPU, or holds a GPU), or
		// while a job holds it.
		live := map[string][]int{}
		jobs.mu.Lock()
		for g := range nGPU {
			for pid := range on[g] {
				if j, ok := jobs.jobs[int(pid)]; ok {
					live[j] = append(live[j], g)
				}
			}
		}
		held := map[int]bool{}
		for j, gs := range jobs.alloc {
			for _, g := range gs {
				held[g] = true
			}
			if live[j] == nil {
				live[j] = []int{}
			}
		}
		jobs.mu.Unlock()
		for j := range jobGPUs {
			if live[j] == nil {
				delete(jobGPUs, j) // ended
			}
		}
		for j, gs := range live {
			if jobGPUs[j] == nil {
				jobGPUs[j] = map[int]bool{}
			}
			for _, g := range gs {
				jobGPUs[j][g] = true
			}
		}
		for g := range nGPU {
			busy := len(on[g]) > 0 || held[g]
			for _, gs := range jobGPUs {
				busy = busy || gs[g]
			}
			if busy {
				busyS[g]++
			}
		}
		poll(a, backend)
		for range 10 {
			fake.Advance(100 * time.Millisecond)
		}
	}
	for g := range nGPU {
		backend.set(g)
	}
	jobs.mu.Lock()
	clear(jobs.alloc)
	jobs.mu.Unlock()
	poll(a, backend)
	for range 30 {
		fake.Advance(100 * time.Millisecond)
	}
	fctx, fcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer fcancel()
	if err := a.up.Flush(fctx); err != nil {
		t.Fatalf("batches not acked: %v", err)
	}

	rec.mu.Lock()
	defer rec.mu.Unlock()
	var idleS, totalS [nGPU]float64
	runs := map[string]bool{}
	for _, b := range rec.batches {
		inRuns := map[uint32]float64{}
		for _, w := range b.GetRunWindows() {
			runs[w.GetRunId()] = true
			if len(w.GetGpuShares()) == 0 {
				for _, g := range w.GetGpus() {
					inRuns[g] += w.GetGpuSeconds() / float64(len(w.GetGpus()))
				}
			}
			for _, sh := range w.GetGpuShares() {
				inRuns[sh.GetGpu()] += sh.GetGpuSeconds()
			}
		}
		for _, gw := range b.GetGpuWindows() {
			g := gw.GetGpu()
			if d := inRuns[g] + gw.GetIdleGpuSeconds() - gw.GetGpuSeconds(); math.Abs(d) > 1e-6 {
				t.Errorf("batch %d GPU %d: runs %.9f + idle %.9f != window %.9f GPU-s", b.GetSeq(), g, inRuns[g], gw.GetIdleGpuSeconds(), gw.GetGpuSeconds())
			}
			idleS[g] += gw.GetIdleGpuSeconds()
			totalS[g] += gw.GetGpuSeconds()
		}
	}
	t.Logf("seed %d: %d runs; per GPU busy %v s, idle %v s of %v s", seed, len(runs), busyS, idleS, totalS)
	for g := range nGPU {
		// Idle is the time no process was on the GPU: the windows before
		// the first and after the last poll included.
		if d := (totalS[g] - idleS[g]) - busyS[g]; math.Abs(d) > 1e-6 {
			t.Errorf("GPU %d: %.6f GPU-s in runs, processes were on it %.0f s", g, totalS[g]-idleS[g], busyS[g])
		}
	}
	if len(runs) < 5 {
		t.Errorf("only %d runs: the arrivals did not exercise owners", len(runs))
	}
}

func simgpu3() *simgpu.Backend { return simgpu.New(3, 1) }

func poll(a *Agent, g *gatedLister) {
	g.open.Store(true)
	a.pollAttribution()
	g.open.Store(false)
}

// attribution.processes off: a process that no run, job or pod owns gets
// no run (its GPU time stays idle); a job's still does.
func TestProcessesAttributionOff(t *testing.T) {
	_, collectorAddr := startRecorder(t)
	backend := &gatedLister{listingSim: &listingSim{Backend: simgpu3(), pids: map[int][]uint32{}}}
	fake := clock.NewFake(time.Date(2026, 11, 27, 10, 0, 0, 0, time.UTC))
	cfg := DefaultConfig()
	cfg.Collector = collectorAddr
	cfg.Socket = filepath.Join(t.TempDir(), "agent.sock")
	cfg.Spool = filepath.Join(t.TempDir(), "spool")
	cfg.Node = "off-node"
	cfg.GPU = "nvml"
	cfg.Attribution.Processes = "off"
	a, err := New(cfg, backend, fake, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	a.procRoot = dir
	jobs := &jobSource{jobs: map[int]string{201: "9"}}
	a.owned.sources = []owner.Source{jobs}
	if err := a.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = a.Shutdown(ctx)
	}()
	ownedFixture(t, dir, 200, ownedProc{uid: 1000, pgid: 200})
	ownedFixture(t, dir, 201, ownedProc{uid: 1001, pgid: 201})
	backend.set(0, 200)
	backend.set(1, 201)
	poll(a, backend)
	a.owned.mu.Lock()
	defer a.owned.mu.Unlock()
	if len(a.owned.runs) != 1 || a.owned.runs["slurm-test-9"] == nil {
		t.Errorf("runs %v: want the job's alone", a.owned.runs)
	}
}
