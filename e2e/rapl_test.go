package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/trainmeter/trainmeter/internal/testkit"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// raplNode is a fixture node: a copy of agent/internal/rapl's two-socket sysfs tree
// and a procfs tree with the runs' processes, both rewritten by the test
// (each file replaced whole by a rename, as a read must never see half a
// file), and the agent's GET /status to know when it has read them.
type raplNode struct {
	t             *testing.T
	sysfs, procfs string
	status        string
	uj            map[string]uint64
}

func newRAPLNode(t *testing.T) *raplNode {
	t.Helper()
	n := &raplNode{t: t, sysfs: t.TempDir(), procfs: t.TempDir(), status: testkit.FreeAddr(t), uj: map[string]uint64{}}
	if err := os.CopyFS(n.sysfs, os.DirFS("../agent/internal/rapl/testdata/two-sockets")); err != nil {
		t.Fatal(err)
	}
	for _, z := range []string{"intel-rapl:0", "intel-rapl:0:0", "intel-rapl:1", "intel-rapl:1:0"} {
		b, err := os.ReadFile(filepath.Join(n.sysfs, "class", "powercap", z, "energy_uj"))
		if err != nil {
			t.Fatal(err)
		}
		n.uj[z], _ = strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	}
	return n
}

func (n *raplNode) replace(path, content string) {
	n.t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		n.t.Fatal(err)
	}
	tmp := path + ".new"
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		n.t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		n.t.Fatal(err)
	}
}

// add advances a zone's energy_uj by joules.
func (n *raplNode) add(zone string, joules uint64) {
	n.uj[zone] += joules * 1_000_000
	n.replace(filepath.Join(n.sysfs, "class", "powercap", zone, "energy_uj"), strconv.FormatUint(n.uj[zone], 10)+"\n")
}

// proc writes /proc/PID/stat with utime+stime = ticks.
func (n *raplNode) proc(pid, ppid, ticks int) {
	n.replace(filepath.Join(n.procfs, strconv.Itoa(pid), "stat"),
		fmt.Sprintf("%d (python3) S %d %d %d 0 -1 4194560 100 0 0 0 %d 0 0 0 20 0 4 0 12345 1000000 100\n", pid, ppid, pid, pid, ticks))
}

func (n *raplNode) reads() float64 {
	he, _ := statusOf(n.t, n.status)["host_energy"].(map[string]any)
	r, _ := he["reads"].(float64)
	return r
}

// afterReads returns right after the agent has completed k more reads of
// the counters than it had when called. The agent reads every second, so
// what the test writes now lands before the next read: a read that began
// before the call may still complete first, hence k = 2 where a read must
// come after something the test did.
func (n *raplNode) afterReads(c *cluster, k float64) {
	n.t.Helper()
	want := n.reads() + k
	c.eventually(fmt.Sprintf("RAPL read %v", want), func() bool { return n.reads() >= want })
}

// A run on a fixture node reports cpu_energy_J and dram_energy_J equal to
// the fixture counters' difference over the run (two sockets summed);
// two runs that overlap split the node's host energy by their process
// trees' CPU time (docs/measurement.md, "Host energy (CPU and DRAM)").
func TestRAPLHostEnergyThroughAgentAndCollector(t *testing.T) {
	c := startCollector(t)
	n := newRAPLNode(t)
	n.proc(4242, 1, 0)
	n.proc(4243, 4242, 0)
	n.proc(5252, 1, 0)
	sock := c.startAgent("rapl-node", "sim:1", "--sysfs-root", n.sysfs, "--procfs-root", n.procfs, "--status-listen", n.status)
	c.waitStreaming("rapl-node")
	if he := statusOf(t, n.status)["host_energy"].(map[string]any); he["status"] != "ok: 2 socket(s), package and dram" {
		t.Fatalf("agent host energy status %v", he)
	}

	// One run alone.
	tr := dialTrainer(t, sock)
	tr.send(`{"event":"run_start","run_id":"rapl-alone","model":"m","warmup_s":0}`)
	tr.sync()
	n.afterReads(c, 2)
	n.add("intel-rapl:0", 120)
	n.add("intel-rapl:1", 95)
	n.add("intel-rapl:0:0", 14)
	n.add("intel-rapl:1:0", 11)
	n.afterReads(c, 2)
	n.add("intel-rapl:0", 30)
	n.add("intel-rapl:1:0", 5)
	n.afterReads(c, 2)
	tr.send(`{"event":"run_end","run_id":"rapl-alone"}`)
	tr.sync()
	c.waitEnded("rapl-alone")
	var r *trainmeterv1.RunReport
	c.eventually("rapl-alone's host energy", func() bool {
		resp, err := c.q.GetRun(context.Background(), &trainmeterv1.GetRunRequest{RunId: "rapl-alone"})
		if err != nil {
			return false
		}
		r = resp.Run
		return r.CpuEnergyJ != nil && r.GetCpuEnergyJ() >= 245 && r.GetDramEnergyJ() >= 30
	})
	if r.GetCpuEnergyJ() != 120+95+30 || r.GetDramEnergyJ() != 14+11+5 {
		t.Fatalf("cpu %v J, dram %v J; want exactly the counters' difference: 245 and 30", r.GetCpuEnergyJ(), r.GetDramEnergyJ())
	}
	if r.GetNodeEnergyJ() != r.GetEnergyTotalJ()+245+30 || r.GetEnergyTotalJ() <= 0 || r.GetHostEnergySplit() != "exclusive" {
		t.Fatalf("node %v J, GPUs %v J, split %q", r.GetNodeEnergyJ(), r.GetEnergyTotalJ(), r.GetHostEnergySplit())
	}
	row := c.csvRow("rapl-alone")
	if row["cpu_energy_J"] != "245" || row["dram_energy_J"] != "30" {
		t.Fatalf("CSV cpu_energy_J %q dram_energy_J %q", row["cpu_energy_J"], row["dram_energy_J"])
	}
	if got, want := num(t, row, "node_energy_J"), num(t, row, "energy_total_J")+275; got < want-1e-5 || got > want+1e-5 {
		t.Fatalf("CSV node_energy_J %v, want energy_total_J + 275 = %v", got, want)
	}
	if rep := c.cli("report", "rapl-alone"); !strings.Contains(rep, "host energy (CPU packages and DRAM") || !strings.Contains(rep, "245.0 J") {
		t.Fatalf("report lacks the host energy:\n%s", rep)
	}

	// Two runs at once: a's process tree (4242 and its child 4243) uses 3
	// CPU-seconds while b's (5252) uses 1 over the interval that carries the
	// energy.
	ta, tb := dialTrainer(t, sock), dialTrainer(t, sock)
	ta.send(`{"event":"run_start","run_id":"rapl-a","model":"m","warmup_s":0,"attribute_pid":4242}`)
	ta.sync()
	tb.send(`{"event":"run_start","run_id":"rapl-b","model":"m","warmup_s":0,"attribute_pid":5252}`)
	tb.sync()
	n.afterReads(c, 2) // a read with both runs on the node: their CPU times' baseline
	n.proc(4242, 1, 200)
	n.proc(4243, 4242, 100)
	n.proc(5252, 1, 100)
	n.add("intel-rapl:0", 300)
	n.add("intel-rapl:1", 100)
	n.add("intel-rapl:0:0", 30)
	n.add("intel-rapl:1:0", 10)
	n.afterReads(c, 2)
	ta.send(`{"event":"run_end","run_id":"rapl-a"}`)
	ta.sync()
	tb.send(`{"event":"run_end","run_id":"rapl-b"}`)
	tb.sync()
	c.waitEnded("rapl-a")
	c.waitEnded("rapl-b")
	var ra, rb *trainmeterv1.RunReport
	c.eventually("the overlapping runs' host energy", func() bool {
		a, err1 := c.q.GetRun(context.Background(), &trainmeterv1.GetRunRequest{RunId: "rapl-a"})
		b, err2 := c.q.GetRun(context.Background(), &trainmeterv1.GetRunRequest{RunId: "rapl-b"})
		if err1 != nil || err2 != nil {
			return false
		}
		ra, rb = a.Run, b.Run
		return ra.GetCpuEnergyJ()+rb.GetCpuEnergyJ() >= 400-1e-9 && ra.GetDramEnergyJ()+rb.GetDramEnergyJ() >= 40-1e-9
	})
	near := func(what string, got, want float64) {
		t.Helper()
		if got < want-1e-9 || got > want+1e-9 {
			t.Errorf("%s = %v, want %v", what, got, want)
		}
	}
	near("a's cpu", ra.GetCpuEnergyJ(), 300)
	near("b's cpu", rb.GetCpuEnergyJ(), 100)
	near("a's dram", ra.GetDramEnergyJ(), 30)
	near("b's dram", rb.GetDramEnergyJ(), 10)
	if ra.GetHostEnergySplit() != "mixed" && ra.GetHostEnergySplit() != "cpu_time" {
		t.Errorf("a's host split %q, want cpu_time (or mixed: equal over intervals before the CPU baseline)", ra.GetHostEnergySplit())
	}
	if out := c.cli("usage", "--since", "1h"); !strings.Contains(out, "HOST (CPU+DRAM) kWh") {
		t.Errorf("usage has no host energy column:\n%s", out)
	}
}

// `trainmeter nodes` (and --json) shows each node's host-energy status as
// its agent says it in its hello and on its GET /status: a node whose RAPL
// counters are read, and one without them.
func TestNodesShowHostEnergyStatus(t *testing.T) {
	c := startCollector(t)
	n := newRAPLNode(t)
	c.startAgent("rapl-node", "sim:1", "--sysfs-root", n.sysfs, "--procfs-root", n.procfs, "--status-listen", n.status)
	bareStatus := testkit.FreeAddr(t)
	c.startAgent("bare-node", "sim:1", "--sysfs-root", t.TempDir(), "--procfs-root", t.TempDir(), "--status-listen", bareStatus)
	c.waitStreaming("rapl-node")
	c.waitStreaming("bare-node")
	agentSays := map[string]string{}
	for node, addr := range map[string]string{"rapl-node": n.status, "bare-node": bareStatus} {
		he, _ := statusOf(t, addr)["host_energy"].(map[string]any)
		agentSays[node], _ = he["status"].(string)
	}
	if agentSays["rapl-node"] != "ok: 2 socket(s), package and dram" || agentSays["bare-node"] == "" || strings.HasPrefix(agentSays["bare-node"], "ok") {
		t.Fatalf("setup: the agents' host energy statuses %q", agentSays)
	}

	var nodes struct {
		Nodes []struct {
			Node             string `json:"node"`
			HostEnergyStatus string `json:"host_energy_status"`
		} `json:"nodes"`
	}
	if err := json.Unmarshal([]byte(c.cli("nodes", "--json")), &nodes); err != nil {
		t.Fatal(err)
	}
	if len(nodes.Nodes) != 2 {
		t.Fatalf("nodes --json: %+v", nodes)
	}
	for _, nd := range nodes.Nodes {
		if nd.HostEnergyStatus != agentSays[nd.Node] {
			t.Errorf("nodes --json: %s's host_energy_status %q, its agent says %q", nd.Node, nd.HostEnergyStatus, agentSays[nd.Node])
		}
	}
	out := c.cli("nodes")
	if !strings.Contains(out, "HOST ENERGY (RAPL)") {
		t.Errorf("trainmeter nodes has no host energy column:\n%s", out)
	}
	for _, line := range strings.Split(out, "\n") {
		for node, says := range agentSays {
			if strings.HasPrefix(line, node+" ") && !strings.HasSuffix(line, says) {
				t.Errorf("trainmeter nodes: %s's row does not end with %q:\n%s", node, says, out)
			}
		}
	}
}
