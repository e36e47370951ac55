package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/trainmeter/trainmeter/collector/internal/loadgen"
)

// agentBench is the agent mode: a fresh collector and one real agent
// (simulated GPUs), whose CPU time, resident memory over time, sampling tick
// jitter (its GET /status) and trainer-socket throughput are measured.
type agentBench struct {
	agentBin, collectorBin string
	gpus                   int
	interval, duration     time.Duration
	// ranks trainer connections of one run, each sending a step every
	// stepEvery; with stepEvery 0 they send as fast as the agent takes them
	// (the socket ingest test).
	ranks     int
	stepEvery time.Duration
	// burn goroutines spin to keep the cores busy with other work.
	burn int
	// prefix runs the agent under a command, e.g. "nice -n -10" or
	// "chrt -r 10" (how deploy/systemd would: Nice=, CPUSchedulingPolicy=).
	prefix string
	// args are extra agent arguments, e.g. "--raw-samples".
	args string
}

type agentStatus struct {
	Sampling struct {
		Ticks        uint64  `json:"ticks"`
		LateTicks    uint64  `json:"late_ticks"`
		SkippedTicks uint64  `json:"skipped_ticks"`
		JitterP50Ms  float64 `json:"tick_jitter_p50_ms"`
		JitterP99Ms  float64 `json:"tick_jitter_p99_ms"`
		JitterMaxMs  float64 `json:"tick_jitter_max_ms"`
	} `json:"sampling"`
	Uplink struct {
		Acked    uint64 `json:"batches_acked"`
		Rejected uint64 `json:"batches_rejected"`
	} `json:"uplink"`
	Socket struct {
		Events      uint64            `json:"events"`
		ParseErrors map[string]uint64 `json:"parse_errors"`
	} `json:"socket"`
}

// bareTickerArg re-executes the load generator as the bare ticker.
const bareTickerArg = "__bare-ticker"

// bareTicker is the floor of a Go sampler: a 50 ms (the agent's interval)
// time.Ticker and nothing else, the cost of being woken by the Go runtime
// 20 times a second. Its loop body is empty on purpose.
func bareTicker(interval string) {
	d, err := time.ParseDuration(interval)
	if err != nil || d <= 0 {
		fmt.Fprintln(os.Stderr, "bare ticker: bad interval", interval)
		os.Exit(2)
	}
	t := time.NewTicker(d)
	for range t.C {
	}
}

func (ab agentBench) run(ctx context.Context, dir string) error {
	c, err := startCollector(ctx, ab.collectorBin, filepath.Join(dir, "collector"))
	if err != nil {
		return err
	}
	defer c.stop()
	statusAddr, err := freeAddr()
	if err != nil {
		return err
	}
	sock := filepath.Join(dir, "agent.sock")
	args := append(strings.Fields(ab.prefix), ab.agentBin, "--collector", c.addr, "--gpu", fmt.Sprintf("sim:%d", ab.gpus),
		"--interval", ab.interval.String(), "--socket", sock, "--spool", filepath.Join(dir, "spool"),
		"--status-listen", statusAddr, "--node", "bench-node", "--log-level", "warn")
	agent, err := startProc(append(args, strings.Fields(ab.args)...)...)
	if err != nil {
		return err
	}
	defer agent.stop()
	var st agentStatus
	for deadline := time.Now().Add(30 * time.Second); ; {
		if _, err := os.Stat(sock); err == nil && getStatus(statusAddr, &st) == nil {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("agent did not come up (status %s, socket %s)", statusAddr, sock)
		}
		select {
		case <-agent.done:
			return fmt.Errorf("agent exited: %v", agent.cmd.ProcessState)
		case <-time.After(100 * time.Millisecond):
		}
	}

	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel() // before the Wait: it ends the burners and trainers
	for i := 0; i < ab.burn; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread()
			x := uint64(i)
			for ctx.Err() == nil {
				for j := 0; j < 1_000_000; j++ {
					x = x*6364136223846793005 + 1442695040888963407
				}
			}
			_ = x
		}()
	}
	var sent atomic.Uint64
	var trainerErr atomic.Value
	for r := 0; r < ab.ranks; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := trainer(ctx, sock, r, ab.stepEvery, &sent); err != nil && ctx.Err() == nil {
				trainerErr.Store(err)
			}
		}()
	}

	// The floor, next to the agent, at the same interval and under the
	// same prefix (nice).
	self, err := os.Executable()
	if err != nil {
		return err
	}
	bare, err := startProc(append(strings.Fields(ab.prefix), self, bareTickerArg, ab.interval.String())...)
	if err != nil {
		return fmt.Errorf("bare ticker: %w", err)
	}
	defer bare.stop()

	// Let the agent settle (runs started, first batches), then measure.
	time.Sleep(3 * time.Second)
	var st0 agentStatus
	if err := getStatus(statusAddr, &st0); err != nil {
		return err
	}
	pid, barePid := agent.cmd.Process.Pid, bare.cmd.Process.Pid
	use0, err := readUsage(pid)
	if err != nil {
		return err
	}
	bareUse0, err := readUsage(barePid)
	if err != nil {
		return err
	}
	t0 := time.Now()
	var rss []float64
	var p99Max, jitMax float64
	step := min(ab.duration, 30*time.Second) // /status jitter covers ~51 s of ticks
	for time.Since(t0) < ab.duration {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-agent.done:
			return fmt.Errorf("agent exited: %v", agent.cmd.ProcessState)
		case <-time.After(min(step, ab.duration-time.Since(t0))):
		}
		m, _ := loadgen.ProcRSS(pid)
		rss = append(rss, m)
		if err := getStatus(statusAddr, &st); err == nil {
			p99Max = max(p99Max, st.Sampling.JitterP99Ms)
			jitMax = max(jitMax, st.Sampling.JitterMaxMs)
		}
		c, _ := loadgen.ProcCPU(pid)
		fmt.Fprintf(os.Stderr, "t=%.0fs agent_rss=%.1fMiB cpu=%.2fs jitter_p99=%.2fms\n", time.Since(t0).Seconds(), m, (c - use0.cpu).Seconds(), st.Sampling.JitterP99Ms)
	}
	elapsed := time.Since(t0)
	use, _ := readUsage(pid)
	bareUse, _ := readUsage(barePid)
	use, bareUse = use.since(use0), bareUse.since(bareUse0)
	if err := getStatus(statusAddr, &st); err != nil {
		return err
	}
	events := st.Socket.Events - st0.Socket.Events
	cpuPct := 100 * use.cpu.Seconds() / elapsed.Seconds()
	line := fmt.Sprintf("agent prefix=%q gpus=%d interval=%v elapsed=%.0fs burn=%d ranks=%d step_every=%v cpu=%.2fs (%.3f%% of one core) "+
		"rss_first=%.1fMiB rss_last=%.1fMiB rss_max=%.1fMiB ticks=%d late_ticks=%d skipped_ticks=%d jitter_p99_max=%.2fms jitter_max=%.2fms "+
		"batches_acked=%d batches_rejected=%d trainer_events=%d (%.0f events/s, %.0f events/cpu-s) sent_lines=%d",
		ab.prefix, ab.gpus, ab.interval, elapsed.Seconds(), ab.burn, ab.ranks, ab.stepEvery, use.cpu.Seconds(), cpuPct,
		rss[0], rss[len(rss)-1], slices.Max(rss), st.Sampling.Ticks-st0.Sampling.Ticks, st.Sampling.LateTicks-st0.Sampling.LateTicks,
		st.Sampling.SkippedTicks-st0.Sampling.SkippedTicks, p99Max, jitMax, st.Uplink.Acked-st0.Uplink.Acked, st.Uplink.Rejected,
		events, float64(events)/elapsed.Seconds(), float64(events)/max(use.cpu.Seconds(), 1e-9), sent.Load())
	barePct := 100 * bareUse.cpu.Seconds() / elapsed.Seconds()
	line += fmt.Sprintf(" bare_go_ticker_cpu=%.2fs (%.3f%% of one core)", bareUse.cpu.Seconds(), barePct) + ratio("ratio_agent/bare_go_ticker", cpuPct, barePct)
	// The scheduler's exact time on CPU (schedstat), where the figures
	// above come in scheduler ticks: at 0.3 % of a core a minute is only a
	// few dozen of them.
	if err := errors.Join(use.oncpuErr, bareUse.oncpuErr); err != nil {
		line += " oncpu=unavailable (" + err.Error() + ")"
	} else {
		agentOn, bareOn := use.oncpu, bareUse.oncpu
		line += fmt.Sprintf(" agent_oncpu=%.1fms/s bare_go_ticker_oncpu=%.1fms/s", 1e3*agentOn.Seconds()/elapsed.Seconds(), 1e3*bareOn.Seconds()/elapsed.Seconds()) +
			ratio("ratio_oncpu", agentOn.Seconds(), bareOn.Seconds())
	}
	// Context switches are counted exactly too.
	wps, bareWps := float64(use.switches)/elapsed.Seconds(), float64(bareUse.switches)/elapsed.Seconds()
	line += fmt.Sprintf(" agent_switches/s=%.1f bare_go_ticker_switches/s=%.1f", wps, bareWps) + ratio("ratio_switches", wps, bareWps)
	if len(st.Socket.ParseErrors) > 0 {
		line += fmt.Sprintf(" parse_errors=%v", st.Socket.ParseErrors)
	}
	if e, _ := trainerErr.Load().(error); e != nil {
		line += " trainer_error=" + e.Error()
	}
	fmt.Println(line)
	return nil
}

// trainer is one rank: run_start, then steps (every stepEvery, or as fast as
// the socket takes them when stepEvery is 0). Replies are read and dropped.
func trainer(ctx context.Context, sock string, rank int, stepEvery time.Duration, sent *atomic.Uint64) error {
	conn, err := net.Dial("unix", sock)
	if err != nil {
		return err
	}
	defer conn.Close()
	go func() { <-ctx.Done(); conn.Close() }()
	go func() {
		r := bufio.NewReader(conn)
		for {
			if _, err := r.ReadSlice('\n'); err != nil && err != bufio.ErrBufferFull {
				return
			}
		}
	}()
	w := bufio.NewWriterSize(conn, 64<<10)
	fmt.Fprintf(w, `{"event":"run_start","run_id":"bench-run","model":"llama-3-8b","backend":"torch","precision":"bf16","batch_size":8,"seq_len":2048,"gpus":[%d]}`+"\n", rank%8)
	if err := w.Flush(); err != nil {
		return err
	}
	var line []byte
	for step := 1; ctx.Err() == nil; step++ {
		line = fmt.Appendf(line[:0], `{"event":"step","run_id":"bench-run","step":%d,"tokens":16384,"samples":8,"data_wait_s":0.012,"compute_s":0.41,"loss":2.31}`+"\n", step)
		if _, err := w.Write(line); err != nil {
			return err
		}
		sent.Add(1)
		if stepEvery > 0 {
			if err := w.Flush(); err != nil {
				return err
			}
			select {
			case <-ctx.Done():
			case <-time.After(stepEvery):
			}
		}
	}
	return nil
}

func getStatus(addr string, v any) error {
	cl := http.Client{Timeout: 5 * time.Second}
	resp, err := cl.Get("http://" + addr + "/status")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return json.NewDecoder(resp.Body).Decode(v)
}

func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// usage is what /proc says a process has used so far.
type usage struct {
	cpu      time.Duration // utime+stime, in scheduler ticks
	oncpu    time.Duration // schedstat: exact time on a CPU
	oncpuErr error         // schedstat unavailable
	switches uint64        // context switches
}

// readUsage reads them all; its error is ProcCPU's.
func readUsage(pid int) (u usage, err error) {
	u.cpu, err = loadgen.ProcCPU(pid)
	u.switches, _ = loadgen.ProcSwitches(pid)
	u.oncpu, u.oncpuErr = loadgen.ProcRunTime(pid)
	return u, err
}

// since is what was used between u0 and u; either's schedstat error holds.
func (u usage) since(u0 usage) usage {
	return usage{cpu: u.cpu - u0.cpu, oncpu: u.oncpu - u0.oncpu, oncpuErr: errors.Join(u0.oncpuErr, u.oncpuErr), switches: u.switches - u0.switches}
}

// ratio is " name=a/b", or nothing when b is 0.
func ratio(name string, a, b float64) string {
	if b <= 0 {
		return ""
	}
	return fmt.Sprintf(" %s=%.2f", name, a/b)
}
