// Command trainmeter-loadgen drives a collector with simulated agents over
// loopback gRPC and prints what it sustained (docs/benchmarks.md).
//
// With --collector-bin it starts a fresh `trainmeter serve` (empty data
// directory) for every load point and reports that process's CPU time,
// resident memory and disk use; with --collector it loads a running one
// (give --pid for its CPU time). --agents, --gpus and --runs take
// comma-separated lists: every combination is one load point.
//
// With --store (or --postgres-bin-dir, a throwaway server) the collectors
// keep their data in PostgreSQL: --replicas of them on one database, each
// load point on emptied tables, the server's CPU time counted with theirs.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/trainmeter/trainmeter/collector/internal/loadgen"
	"github.com/trainmeter/trainmeter/internal/pgserver"
)

func main() {
	// The floor the agent is compared with (agent mode): this program
	// re-executed as a Go process that only ticks.
	if len(os.Args) == 3 && os.Args[1] == bareTickerArg {
		bareTicker(os.Args[2])
		return
	}
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "trainmeter-loadgen:", err)
		os.Exit(1)
	}
}

func run() error {
	var (
		addr, bin, dataRoot, agentsL, gpusL, runsL, exportBin, otelBin string
		collectorArgs                                                  string
		storeURL, pgBin, storeParams, pgSettings                       string
		pid, conns, raw, replicas, pgStatements                        int
		interval, duration                                             time.Duration
		probes                                                         int
		ab                                                             agentBench
	)
	flag.StringVar(&addr, "collector", "", "load a running collector at HOST:PORT")
	flag.IntVar(&pid, "pid", 0, "with --collector: its process id, for CPU time and memory")
	flag.StringVar(&bin, "collector-bin", "", "start this trainmeter binary (its serve command) afresh for every load point")
	flag.StringVar(&collectorArgs, "collector-args", "", `with --collector-bin: extra "serve" arguments, e.g. "--commit-window 0" (A/B of a setting)`)
	flag.StringVar(&storeURL, "store", "", "with --collector-bin: keep the data in this PostgreSQL database (postgres://…; on this machine, for its CPU time); every table in its current schema is dropped before each load point")
	flag.StringVar(&pgBin, "postgres-bin-dir", "", `with --collector-bin, instead of --store: start a throwaway PostgreSQL (fsync on, pg_stat_statements loaded) from this directory's initdb and pg_ctl ("auto": on PATH or the newest under /usr/lib/postgresql), as user nobody when run as root`)
	flag.IntVar(&replicas, "replicas", 1, "with --store: collectors on the database; agent i sends to replica i mod N")
	flag.StringVar(&storeParams, "store-params", "", `with --store or --postgres-bin-dir: parameters added to the database URL, e.g. "pool_max_conns=16" (each collector's connections; pgx's default is max(4, CPUs)) or "synchronous_commit=off" (a session setting)`)
	flag.StringVar(&pgSettings, "pg-settings", "", `with --postgres-bin-dir: server settings added to the throwaway PostgreSQL's, space-separated, e.g. docs/deploy.md's "max_wal_size=16GB checkpoint_timeout=15min wal_compression=lz4 shared_buffers=1GB"`)
	flag.IntVar(&pgStatements, "pg-statements", 0, "with --store: after each point print the N statements of most execution time (pg_stat_statements, created in the database if missing)")
	flag.StringVar(&dataRoot, "data-root", "", "with --collector-bin: where the data directories go (default: a temp dir, removed)")
	flag.StringVar(&agentsL, "agents", "100", "simulated agents (list)")
	flag.StringVar(&gpusL, "gpus", "8", "GPUs per agent (list)")
	flag.StringVar(&runsL, "runs", "0", "distinct runs over all agents (list; 0 = one per agent)")
	flag.IntVar(&raw, "raw-samples", 0, "raw samples per GPU per batch (0: none; 20 is 1 s at 50 ms)")
	flag.IntVar(&conns, "conns", 0, "HTTP/2 connections the streams share (0 = min(agents, 64))")
	flag.DurationVar(&interval, "interval", time.Second, "batch cadence per agent")
	flag.DurationVar(&duration, "duration", 20*time.Second, "measured span per load point")
	flag.IntVar(&probes, "probes", 3, "sample-to-visible probes per load point (a new run each)")
	flag.StringVar(&otelBin, "otelcol-bin", "", "after each load point, run the same load as OTLP metrics against a fresh OpenTelemetry Collector (this binary; otlp receiver -> file exporter) and print the ratio of GPU-samples per CPU-second")
	flag.StringVar(&exportBin, "export-bin", "", "after each load point, time `BIN export csv` of all runs (usually the same trainmeter binary)")
	flag.StringVar(&ab.agentBin, "agent-bin", "", "agent mode: run this trainmeter-agent (sim GPUs) against a fresh --collector-bin and measure it")
	flag.IntVar(&ab.gpus, "agent-gpus", 8, "agent mode: simulated GPUs")
	flag.DurationVar(&ab.interval, "agent-interval", 50*time.Millisecond, "agent mode: sampling interval")
	flag.IntVar(&ab.ranks, "ranks", 8, "agent mode: trainer connections (ranks of one run)")
	flag.DurationVar(&ab.stepEvery, "step-every", 500*time.Millisecond, "agent mode: step period per rank (0: as fast as the socket takes them)")
	flag.IntVar(&ab.burn, "burn", 0, "agent mode: goroutines (threads) that spin, keeping the cores busy with other work")
	flag.StringVar(&ab.prefix, "agent-prefix", "", `agent mode: run the agent under this command, e.g. "nice -n -10" or "chrt -r 10"`)
	flag.StringVar(&ab.args, "agent-args", "", `agent mode: extra agent arguments, e.g. "--raw-samples"`)
	flag.Parse()
	if ab.agentBin != "" {
		if bin == "" {
			return errors.New("agent mode needs --collector-bin")
		}
		ab.collectorBin, ab.duration = bin, duration
		dir, err := os.MkdirTemp("", "trainmeter-agentbench-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		return ab.run(ctx, dir)
	}
	if (addr == "") == (bin == "") {
		return errors.New("give exactly one of --collector and --collector-bin")
	}
	if (storeURL != "" || pgBin != "") && bin == "" {
		return errors.New("--store and --postgres-bin-dir need --collector-bin")
	}
	if storeURL != "" && pgBin != "" {
		return errors.New("give at most one of --store and --postgres-bin-dir")
	}
	if replicas < 1 || replicas > 1 && storeURL == "" && pgBin == "" {
		return errors.New("--replicas needs --store or --postgres-bin-dir and must be >= 1")
	}
	if otelBin != "" && bin == "" {
		return errors.New("--otelcol-bin needs --collector-bin (both are measured the same way)")
	}
	var err error
	var lists [3][]int
	for i, l := range [3]struct{ flag, val string }{{"agents", agentsL}, {"gpus", gpusL}, {"runs", runsL}} {
		if lists[i], err = ints(l.val); err != nil {
			return fmt.Errorf("--%s: %w", l.flag, err)
		}
	}
	agents, gpus, runs := lists[0], lists[1], lists[2]
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if bin != "" && dataRoot == "" {
		dataRoot, err = os.MkdirTemp("", "trainmeter-loadgen-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dataRoot)
	}
	var pg *pgPoint
	if pgBin != "" {
		if pgBin == "auto" {
			pgBin = ""
		}
		settings := append([]string{"max_connections=300", "shared_preload_libraries=pg_stat_statements"}, strings.Fields(pgSettings)...)
		srv, err := pgserver.Start(pgBin, settings...)
		if err != nil {
			return err
		}
		defer srv.Stop()
		if storeURL, err = srv.CreateDB("loadgen"); err != nil {
			return err
		}
	}
	if storeURL != "" && storeParams != "" {
		u, err := url.Parse(storeURL)
		if err != nil {
			return fmt.Errorf("--store: %w", err)
		}
		add, err := url.ParseQuery(storeParams)
		if err != nil {
			return fmt.Errorf("--store-params: %w", err)
		}
		q := u.Query()
		for k, v := range add {
			q[k] = v
		}
		u.RawQuery = q.Encode()
		storeURL = u.String()
	}
	if storeURL != "" {
		pg = &pgPoint{url: storeURL, replicas: replicas, statements: pgStatements}
		if pg.postmaster, err = loadgen.PostmasterPID(ctx, storeURL); err != nil {
			return err
		}
	}
	point := 0
	for _, a := range agents {
		for _, g := range gpus {
			for _, r := range runs {
				point++
				cfg := loadgen.Config{Addrs: []string{addr}, Agents: a, GPUs: g, Runs: r, Interval: interval, Duration: duration,
					Conns: conns, PIDs: []int{pid}, RunPrefix: fmt.Sprintf("p%d-", point), RawSamples: raw}
				res, err := onePoint(ctx, cfg, bin, strings.Fields(collectorArgs), filepath.Join(dataRoot, strconv.Itoa(point)), probes, exportBin, pg)
				if err != nil {
					return err
				}
				if otelBin != "" {
					cfg.OTLP, cfg.RunPrefix = true, cfg.RunPrefix+"otlp-"
					ores, err := otelPoint(ctx, cfg, otelBin, filepath.Join(dataRoot, strconv.Itoa(point)+"-otelcol"))
					if err != nil {
						return err
					}
					if o := ores.SamplesPerCPUSecond(); o > 0 {
						fmt.Printf("ratio trainmeter/otelcol gpu-samples per cpu-second = %.2f (trainmeter %.0f durable, otelcol %.0f to a file without fsync)\n",
							res.SamplesPerCPUSecond()/o, res.SamplesPerCPUSecond(), o)
					}
				}
			}
		}
	}
	return nil
}

func onePoint(ctx context.Context, cfg loadgen.Config, bin string, binArgs []string, dataDir string, probes int, exportBin string, pg *pgPoint) (loadgen.Result, error) {
	if pg != nil {
		if err := loadgen.EmptyDB(ctx, pg.url); err != nil {
			return loadgen.Result{}, fmt.Errorf("emptying the database: %w", err)
		}
		cfg.Addrs, cfg.PIDs, cfg.DBPID = nil, nil, pg.postmaster
		for range pg.replicas {
			c, err := startCollector(ctx, bin, "", append([]string{"--store", pg.url}, binArgs...)...)
			if err != nil {
				return loadgen.Result{}, err
			}
			defer c.stop()
			cfg.Addrs, cfg.PIDs = append(cfg.Addrs, c.addr), append(cfg.PIDs, c.cmd.Process.Pid)
		}
		if pg.statements > 0 {
			if err := pg.resetStatements(ctx); err != nil {
				return loadgen.Result{}, err
			}
			defer func() {
				if err := pg.printStatements(ctx); err != nil {
					fmt.Fprintln(os.Stderr, "pg_stat_statements:", err)
				}
			}()
		}
	} else if bin != "" {
		c, err := startCollector(ctx, bin, dataDir, binArgs...)
		if err != nil {
			return loadgen.Result{}, err
		}
		defer c.stop()
		cfg.Addrs, cfg.PIDs = []string{c.addr}, []int{c.cmd.Process.Pid}
	}
	// Probes run while the load is on: a new run every few seconds.
	vis := make(chan []time.Duration, 1)
	pctx, pcancel := context.WithCancel(ctx)
	go func() {
		var out []time.Duration
		defer func() { vis <- out }()
		for i := 0; i < probes; i++ {
			select {
			case <-pctx.Done():
				return
			case <-time.After(cfg.Duration / time.Duration(probes+1)):
			}
			d, err := loadgen.Visibility(pctx, cfg.Addrs[0], fmt.Sprintf("%s%d-%d", cfg.RunPrefix, time.Now().UnixNano(), i))
			if err != nil {
				if pctx.Err() == nil {
					fmt.Fprintln(os.Stderr, "visibility probe:", err)
				}
				return
			}
			out = append(out, d)
		}
	}()
	res, err := loadgen.Run(ctx, cfg)
	pcancel()
	v := <-vis
	line := res.String()
	if len(v) > 0 {
		line += fmt.Sprintf(" visible_max=%.1fms (%d probes)", float64(slices.Max(v))/float64(time.Millisecond), len(v))
	}
	if bin != "" && pg == nil {
		if n, derr := dirSize(dataDir); derr == nil && res.Acked > 0 {
			gpuSeconds := float64(res.Acked) * float64(res.GPUs) * res.Interval.Seconds()
			line += fmt.Sprintf(" disk=%.1fMiB (%.1f MiB per GPU-day, before compaction)", float64(n)/(1<<20), float64(n)/gpuSeconds*86400/(1<<20))
		}
	}
	if exportBin != "" && err == nil {
		t0 := time.Now()
		out, xerr := exec.CommandContext(ctx, exportBin, "export", "csv", "--collector", cfg.Addrs[0], "--timeout", "5m").Output()
		if xerr != nil {
			return res, fmt.Errorf("export csv: %w", xerr)
		}
		line += fmt.Sprintf(" export_csv=%.0fms (%d rows)", float64(time.Since(t0))/float64(time.Millisecond), strings.Count(string(out), "\n")-1)
	}
	fmt.Println(line)
	return res, err
}

// otelPoint runs the load as OTLP against a fresh OpenTelemetry Collector:
// OTLP gRPC receiver straight to the file exporter (no batch processor).
func otelPoint(ctx context.Context, cfg loadgen.Config, bin, dir string) (loadgen.Result, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return loadgen.Result{}, err
	}
	addr, err := freeAddr()
	if err != nil {
		return loadgen.Result{}, err
	}
	conf := filepath.Join(dir, "otelcol.yaml")
	yaml := fmt.Sprintf(`receivers:
  otlp:
    protocols:
      grpc:
        endpoint: %s
exporters:
  file:
    path: %s
service:
  telemetry:
    logs:
      level: warn
    metrics:
      level: none
  pipelines:
    metrics:
      receivers: [otlp]
      exporters: [file]
`, addr, filepath.Join(dir, "metrics.jsonl"))
	if err := os.WriteFile(conf, []byte(yaml), 0o644); err != nil {
		return loadgen.Result{}, err
	}
	c, err := startProcess(ctx, addr, bin, "--config", conf)
	if err != nil {
		return loadgen.Result{}, err
	}
	defer c.stop()
	cfg.Addrs, cfg.PIDs, cfg.DBPID = []string{addr}, []int{c.cmd.Process.Pid}, 0
	res, err := loadgen.Run(ctx, cfg)
	line := "otelcol " + res.String()
	if n, derr := dirSize(dir); derr == nil {
		line += fmt.Sprintf(" disk=%.1fMiB", float64(n)/(1<<20))
	}
	fmt.Println(line)
	return res, err
}

// proc is a child process whose output goes to stderr, and for a
// collector (or OpenTelemetry Collector) the address it listens on.
type proc struct {
	cmd  *exec.Cmd
	done chan struct{} // closed when it has exited
	addr string
}

func startProc(args ...string) (*proc, error) {
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &proc{cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(p.done) }()
	return p, nil
}

// stop sends SIGTERM and waits, killing the process after 20 s.
func (p *proc) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(20 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

func startCollector(ctx context.Context, bin, dataDir string, extra ...string) (*proc, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	args := []string{"serve", "--listen", addr, "--ui-listen", "", "--log-level", "warn"}
	if dataDir != "" {
		args = append(args, "--data", dataDir)
	}
	return startProcess(ctx, addr, bin, append(args, extra...)...)
}

// startProcess starts bin with args and waits until it listens on addr.
func startProcess(ctx context.Context, addr, bin string, args ...string) (*proc, error) {
	c, err := startProc(append([]string{bin}, args...)...)
	if err != nil {
		return nil, err
	}
	c.addr = addr
	deadline := time.Now().Add(30 * time.Second)
	for {
		conn, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			conn.Close()
			return c, nil
		}
		select {
		case <-c.done:
			return nil, fmt.Errorf("collector exited: %v", c.cmd.ProcessState)
		case <-ctx.Done():
			c.stop()
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			c.stop()
			return nil, fmt.Errorf("collector did not listen on %s", addr)
		}
	}
}

func dirSize(dir string) (int64, error) {
	var n int64
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		// Blocks, not Size: badger preallocates its value log and memtable
		// files sparsely.
		if st, ok := info.Sys().(*syscall.Stat_t); ok {
			n += st.Blocks * 512
		} else {
			n += info.Size()
		}
		return nil
	})
	return n, err
}

func ints(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			return nil, err
		}
		out = append(out, n)
	}
	return out, nil
}
