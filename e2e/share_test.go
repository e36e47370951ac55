package e2e

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// writeSharedTrace writes a 1-GPU trace at a constant 300 W whose counter
// advances at 300 W, with per-run SM columns when sm is not empty.
func writeSharedTrace(t *testing.T, seconds float64, sm map[string]float64) string {
	t.Helper()
	var b strings.Builder
	b.WriteString("time_s,gpu,power_w,energy_j,memory_used_mib,memory_total_mib,utilization_pct")
	var runs []string
	for id := range sm {
		runs = append(runs, id)
		b.WriteString(",run_sm_pct:" + id)
	}
	b.WriteString("\n")
	for i := 0; float64(i)*0.1 <= seconds; i++ {
		ts := float64(i) * 0.1
		fmt.Fprintf(&b, "%.1f,0,300,%.3f,30000,81559,95", ts, 5e5+300*ts)
		for _, id := range runs {
			fmt.Fprintf(&b, ",%g", sm[id])
		}
		b.WriteString("\n")
	}
	path := filepath.Join(t.TempDir(), "trace.csv")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// twoRunsOnGPU0 has two trainers start a run each on GPU 0, step together
// for 6 s and end.
func twoRunsOnGPU0(t *testing.T, sock, a, b string) {
	var wg sync.WaitGroup
	for _, id := range []string{a, b} {
		tr := dialTrainer(t, sock)
		tr.send(`{"event":"run_start","run_id":%q,"model":"m","gpus":[0],"warmup_s":0}`, id)
		tr.sync()
		wg.Add(1)
		go func() {
			defer wg.Done()
			tr.runSteps(id, 60, 1000, 100*time.Millisecond)
			tr.send(`{"event":"run_end","run_id":%q}`, id)
			tr.sync()
		}()
	}
	wg.Wait()
}

type usageJSON struct {
	Rows []struct {
		Keys       []string `json:"keys"`
		IdleNode   string   `json:"idle_node"`
		Idle       bool     `json:"idle"`
		Deleted    bool     `json:"deleted"`
		GPUSeconds float64  `json:"gpu_seconds"`
		EnergyJ    float64  `json:"energy_j"`
		CostUSD    float64  `json:"cost_usd"`
		Runs       uint32   `json:"runs"`
	} `json:"rows"`
	Nodes []struct {
		Node       string  `json:"node"`
		GPUSeconds float64 `json:"gpu_seconds"`
		EnergyJ    float64 `json:"energy_j"`
		IdleS      float64 `json:"idle_gpu_seconds"`
		IdleJ      float64 `json:"idle_energy_j"`
	} `json:"nodes"`
}

// checkConserved: usage --by node's rows of each node (its runs, idle and
// deleted runs) add up to the node's GPU-seconds, energy and, at one GPU
// price ($/h) and energy price ($/kWh), dollars; its idle rows to its idle
// figures.
func checkConserved(t *testing.T, u usageJSON, gpuPrice, energyPrice float64) {
	t.Helper()
	type fig struct{ s, j, usd, idleS, idleJ float64 }
	rows := map[string]*fig{}
	for _, r := range u.Rows {
		node := r.IdleNode
		if !r.Idle {
			node = r.Keys[0]
		}
		if rows[node] == nil {
			rows[node] = &fig{}
		}
		f := rows[node]
		f.s, f.j, f.usd = f.s+r.GPUSeconds, f.j+r.EnergyJ, f.usd+r.CostUSD
		if r.Idle {
			f.idleS, f.idleJ = f.idleS+r.GPUSeconds, f.idleJ+r.EnergyJ
		}
	}
	for _, n := range u.Nodes {
		f := rows[n.Node]
		if f == nil {
			t.Errorf("usage: no rows of node %s", n.Node)
			continue
		}
		// GPU-seconds to 1e-6: the agent's run shares and idle of a window
		// add up to its length within tens of nanoseconds (seen up to 130 ns
		// over 10 GPU-s), not to the last bit; a misbooked share is far more.
		within(t, n.Node+"'s rows (GPU-s)", f.s, n.GPUSeconds, 1e-6)
		within(t, n.Node+"'s rows (J)", f.j, n.EnergyJ, 1e-9)
		within(t, n.Node+"'s rows ($)", f.usd, n.GPUSeconds/3600*gpuPrice+n.EnergyJ/3.6e6*energyPrice, 1e-6)
		within(t, n.Node+"'s idle rows (GPU-s)", f.idleS, n.IdleS, 1e-6)
		within(t, n.Node+"'s idle rows (J)", f.idleJ, n.IdleJ, 1e-9)
	}
}

// The case: two runs on one replayed 300 W GPU stepping together
// for 6 s. Summed over both runs they are billed the GPU's energy and
// GPU-seconds once (not twice), split equally; with per-run utilisation in
// the trace, split by it. `trainmeter usage` adds runs and idle up to the
// node's counter difference.
func TestSharedGPUIsBilledOnce(t *testing.T) {
	c := startCollector(t, "--gpu-price-per-hour", "3.6")
	eqSock := c.startAgent("eq-node", "replay:"+writeSharedTrace(t, 120, nil), "--warmup", "0s")
	utilSock := c.startAgent("util-node", "replay:"+writeSharedTrace(t, 120, map[string]float64{"util-a": 60, "util-b": 20}), "--warmup", "0s")
	c.waitStreaming("eq-node")
	c.waitStreaming("util-node")

	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); twoRunsOnGPU0(t, eqSock, "eq-a", "eq-b") }()
	go func() { defer wg.Done(); twoRunsOnGPU0(t, utilSock, "util-a", "util-b") }()
	wg.Wait()

	for _, tc := range []struct {
		a, b, method string
		shareA       float64
	}{{"eq-a", "eq-b", "equal", 0.5}, {"util-a", "util-b", "utilization", 0.75}} {
		ra, rb := c.waitEnded(tc.a), c.waitEnded(tc.b)
		from := math.Min(float64(ra.Start.AsTime().UnixNano()), float64(rb.Start.AsTime().UnixNano())) / 1e9
		to := math.Max(float64(ra.End.AsTime().UnixNano()), float64(rb.End.AsTime().UnixNano())) / 1e9
		span := to - from
		if span < 6 {
			t.Fatalf("%s/%s ran %.2f s", tc.a, tc.b, span)
		}
		// The GPU drew 300 W over the span: billed once in all.
		within(t, tc.a+"+"+tc.b+" energy (J)", ra.EnergyTotalJ+rb.EnergyTotalJ, 300*span, 0.005)
		within(t, tc.a+"+"+tc.b+" GPU-seconds", 3600*(ra.GpuHours+rb.GpuHours), span, 0.005)
		// Most of the span they shared: the split follows the rule.
		within(t, tc.a+"'s share of the energy", ra.EnergyTotalJ/(ra.EnergyTotalJ+rb.EnergyTotalJ), tc.shareA, 0.02)
		row := c.csvRow(tc.a)
		if row["gpu_share_method"] != tc.method || num(t, row, "shared_gpu_s") < 5.5 {
			t.Errorf("%s: gpu_share_method %q, shared_gpu_s %q; want %s, ~6", tc.a, row["gpu_share_method"], row["shared_gpu_s"], tc.method)
		}
		if rep := c.cli("report", tc.a); !strings.Contains(rep, "with up to 2 runs at once") {
			t.Errorf("report of %s does not say the GPU was shared:\n%s", tc.a, rep)
		}
	}

	// usage over whole seconds the agents were streaming: every window's
	// start in [since, until) is in, so the node's GPU time is exactly the
	// period and its energy the counter's 300 W over it.
	ra := c.waitEnded("eq-a")
	since := ra.Start.AsTime().Truncate(time.Second).Add(time.Second)
	until := since.Add(10 * time.Second)
	var u usageJSON
	c.eventually("usage covering the period", func() bool {
		out := c.cli("usage", "--by", "node", "--json", "--since", since.Format(time.RFC3339), "--until", until.Format(time.RFC3339))
		if err := json.Unmarshal([]byte(out), &u); err != nil {
			t.Fatalf("usage --json: %v\n%s", err, out)
		}
		for _, n := range u.Nodes {
			if n.Node == "eq-node" && math.Abs(n.GPUSeconds-10) < 1e-6 {
				return true
			}
		}
		return false
	})
	var nodeJ, rowsJ, idleJ float64
	for _, n := range u.Nodes {
		if n.Node == "eq-node" {
			nodeJ = n.EnergyJ
		}
	}
	for _, r := range u.Rows {
		if (r.Idle && r.IdleNode == "eq-node") || (!r.Idle && r.Keys[0] == "eq-node") {
			rowsJ += r.EnergyJ
			if r.Idle {
				idleJ += r.EnergyJ
			}
		}
	}
	checkConserved(t, u, 3.6, 0)
	within(t, "eq-node's energy (J) = counter difference", nodeJ, 300*10, 0.005)
	within(t, "eq-node's runs + idle (J)", rowsJ, 300*10, 0.005)
	if idleJ < 300 {
		t.Errorf("eq-node idle %.1f J: the GPU idled before and after the runs", idleJ)
	}

	// The table and the CSV, by user: the runs' user and an idle row per node.
	table := c.cli("usage", "--by", "user", "--since", since.Format(time.RFC3339), "--until", until.Format(time.RFC3339))
	for _, want := range []string{"USER", "(idle) eq-node", "(idle) util-node", "node totals"} {
		if !strings.Contains(table, want) {
			t.Errorf("usage table lacks %q:\n%s", want, table)
		}
	}
	csvOut := c.cli("usage", "--by", "user", "--csv")
	if !strings.HasPrefix(csvOut, "user,idle_node,runs,gpu_hours,energy_kWh,cost_usd,gpu_share,energy_share,price_source,deleted\n") ||
		!strings.Contains(csvOut, "(idle),eq-node,0,") {
		t.Errorf("usage --csv:\n%s", csvOut)
	}
}

// The agent is killed while two runs share a GPU and started again on the
// same spool; both trainers (the real Python client) reconnect. Together
// the runs are billed the GPU's energy over their span once, the downtime
// included (split equally: nothing says what each did meanwhile).
func TestAgentRestartWhileTwoRunsShareAGPU(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("python3 not installed")
	}
	c := startCollector(t, "--gpu-price-per-hour", "3.6", "--energy-price-kwh", "0.2")
	dir := t.TempDir()
	sock := filepath.Join(dir, "agent.sock")
	anchor := strconv.FormatFloat(float64(time.Now().UnixNano())/1e9, 'f', 3, 64)
	agentArgs := []string{"--collector", c.addr, "--socket", sock, "--node", "share-kill",
		"--gpu", "replay:" + writeSharedTrace(t, 120, nil) + "@" + anchor, "--spool", filepath.Join(dir, "spool"), "--rejoin-grace", "30s"}
	first := daemon(t, "trainmeter-agent", agentArgs...)
	c.eventually("agent socket", func() bool { return dialable(sock) })

	var trainers []*exec.Cmd
	for _, id := range []string{"kshare-a", "kshare-b"} {
		tr := exec.Command("python3", "../clients/python/examples/train_sim.py", "--socket", sock,
			"--run-id", id, "--model", "m", "--backend", "b", "--gpus", "0", "--warmup-s", "1",
			"--duration-s", "9", "--tokens-per-s", "20000", "--step-time", "0.05")
		out, err := os.CreateTemp(dir, "trainer")
		if err != nil {
			t.Fatal(err)
		}
		tr.Stdout, tr.Stderr = out, out
		if err := tr.Start(); err != nil {
			t.Fatal(err)
		}
		trainers = append(trainers, tr)
	}
	time.Sleep(3 * time.Second)
	if err := first.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond)
	daemon(t, "trainmeter-agent", agentArgs...)
	for _, tr := range trainers {
		if err := tr.Wait(); err != nil {
			t.Fatalf("trainer: %v", err)
		}
	}
	ra, rb := c.waitEnded("kshare-a"), c.waitEnded("kshare-b")
	from := math.Min(float64(ra.Start.AsTime().UnixNano()), float64(rb.Start.AsTime().UnixNano())) / 1e9
	to := math.Max(float64(ra.End.AsTime().UnixNano()), float64(rb.End.AsTime().UnixNano())) / 1e9
	within(t, "both runs' energy across the restart (J)", ra.EnergyTotalJ+rb.EnergyTotalJ, 300*(to-from), 0.01)
	within(t, "both runs' GPU-seconds across the restart", 3600*(ra.GpuHours+rb.GpuHours), to-from, 0.01)
	within(t, "kshare-a's share", ra.EnergyTotalJ/(ra.EnergyTotalJ+rb.EnergyTotalJ), 0.5, 0.03)
	if ra.GpuShareMethod != "equal" || ra.MaxSharingRuns != 2 {
		t.Errorf("kshare-a: share method %q, max sharing %d", ra.GpuShareMethod, ra.MaxSharingRuns)
	}
	// The node's stored figures through the restart: runs + idle = its
	// GPU-seconds, energy and dollars (the downtime included), and its
	// runs' rows are the runs.
	var u usageJSON
	if err := json.Unmarshal([]byte(c.cli("usage", "--json")), &u); err != nil {
		t.Fatal(err)
	}
	checkConserved(t, u, 3.6, 0.2)
	var rowsJ, runsJ float64
	for _, r := range u.Rows {
		rowsJ += r.EnergyJ
		if !r.Idle {
			runsJ += r.EnergyJ
		}
	}
	if len(u.Nodes) != 1 {
		t.Fatalf("usage nodes %+v", u.Nodes)
	}
	within(t, "usage runs + idle = node energy (J)", rowsJ, u.Nodes[0].EnergyJ, 1e-9)
	within(t, "usage runs (J)", runsJ, ra.EnergyTotalJ+rb.EnergyTotalJ, 1e-6)
}
