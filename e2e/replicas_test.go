package e2e

// Collector replicas on one PostgreSQL database, agents in
// `--collector-mode any` (docs/deploy.md, "On PostgreSQL"): each batch goes
// to one replica, the next when the one in use dies.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/trainmeter/trainmeter/internal/pgtest"
	"github.com/trainmeter/trainmeter/internal/testkit"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// replica is a collector on the database that the test can kill and start
// again on the same address.
type replica struct {
	*cluster
	args   []string
	dir    string // working directory ("": the test's)
	status string // its GET /status address
	p      *proc
}

// startReplica starts a collector on the database at url with a data
// directory of its own (which --store leaves unused) and extra flags.
func startReplica(t *testing.T, url string, extra ...string) *replica {
	t.Helper()
	return newReplica(t, "", append([]string{"--store", url, "--data", filepath.Join(t.TempDir(), "data")}, extra...))
}

// startFreshReplica starts a collector on the database at url without
// --data, in a new empty working directory, which it returns.
func startFreshReplica(t *testing.T, url string, extra ...string) (*replica, string) {
	t.Helper()
	dir := t.TempDir()
	return newReplica(t, dir, append([]string{"--store", url}, extra...)), dir
}

func newReplica(t *testing.T, dir string, args []string) *replica {
	t.Helper()
	addr, status := testkit.FreeAddr(t), testkit.FreeAddr(t)
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	r := &replica{cluster: &cluster{t: t, addr: addr, q: trainmeterv1.NewQueryServiceClient(conn)}, dir: dir, status: status,
		args: append([]string{"serve", "--listen", addr, "--ui-listen", "", "--status-listen", status}, args...)}
	r.start()
	return r
}

func (r *replica) start() {
	r.t.Helper()
	r.p = startProcIn(r.t, r.dir, "trainmeter", r.args...)
	r.eventually("replica answering", func() bool {
		_, err := r.q.ListRuns(context.Background(), &trainmeterv1.ListRunsRequest{})
		return err == nil
	})
}

// alive: the replica's process has not exited.
func (r *replica) alive() bool {
	select {
	case <-r.p.done:
		return false
	default:
		return true
	}
}

// leads reports the replica's GET /status "leader" (false while it does
// not answer).
func (r *replica) leads() bool {
	resp, err := http.Get("http://" + r.status + "/status")
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	var st struct {
		Leader bool `json:"leader"`
	}
	return json.NewDecoder(resp.Body).Decode(&st) == nil && st.Leader
}

// waitLeader waits until exactly one of the live replicas leads and
// returns it.
func waitLeader(t *testing.T, reps []*replica) *replica {
	t.Helper()
	var leader *replica
	reps[0].eventually("exactly one live replica leading", func() bool {
		leader = nil
		n := 0
		for _, r := range reps {
			if r.alive() && r.leads() {
				leader = r
				n++
			}
		}
		return n == 1
	})
	return leader
}

// anyAgent starts an agent on node listing every replica in mode any, waits
// until it streams to one, and returns its socket, process and GET /status
// address.
func anyAgent(t *testing.T, reps []*replica, node, gpuSpec string, extra ...string) (sock string, p *proc, status string) {
	t.Helper()
	var list []string
	for _, r := range reps {
		list = append(list, r.addr)
	}
	status = testkit.FreeAddr(t)
	sock = filepath.Join(t.TempDir(), "agent.sock")
	p = startProc(t, "trainmeter-agent", append([]string{"--collector", strings.Join(list, ","), "--collector-mode", "any", "--socket", sock,
		"--node", node, "--gpu", gpuSpec, "--spool", filepath.Join(t.TempDir(), "spool"), "--status-listen", status, "--shutdown-timeout", "2s"}, extra...)...)
	reps[0].eventually("agent "+node+" streaming in mode any", func() bool {
		select {
		case <-p.done:
			t.Fatalf("agent exited:\n%s", p.log())
		default:
		}
		up := uplinkStatus(status)
		return up["collector_mode"] == "any" && up["collector_in_use"] != nil && up["connected"] == true
	})
	return sock, p, status
}

// inUse is the replica an agent (by its GET /status address) streams to.
func inUse(status string) string {
	s, _ := uplinkStatus(status)["collector_in_use"].(string)
	return s
}

// uplinkStatus is the agent's GET /status "uplink" object; nil while the
// agent does not answer.
func uplinkStatus(addr string) map[string]any {
	resp, err := http.Get("http://" + addr + "/status")
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	var st struct {
		Uplink map[string]any `json:"uplink"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&st)
	return st.Uplink
}

// Two replicas on one database, two agents (sim GPU) listing both in mode
// any, one run on both nodes. The replica one agent streams to is killed
// (SIGKILL) mid-run: that agent moves to the other and re-sends what was not
// acked; the run ends with every token, complete, nothing lost, and each
// replica (the killed one started again) answers the same `report --json`.
func TestReplicasAgentsInModeAnyOneReplicaKilledMidRun(t *testing.T) {
	t.Parallel()
	url := pgtest.ServerDB(t)
	reps := []*replica{startReplica(t, url), startReplica(t, url)}
	var trs []*trainer
	var statuses []string
	for i, node := range []string{"any-a", "any-b"} {
		sock, _, status := anyAgent(t, reps, node, "sim:1")
		statuses = append(statuses, status)
		tr := dialTrainer(t, sock)
		tr.send(`{"event":"run_start","run_id":"any-run","model":"m","warmup_s":0,"rank":%d}`, i)
		trs = append(trs, tr)
	}
	sent := 0
	stepAll := func(from, n int) {
		for s := from; s < from+n; s++ {
			time.Sleep(100 * time.Millisecond)
			for i, tr := range trs {
				tokens := 500 + i
				tr.send(`{"event":"step","run_id":"any-run","step":%d,"tokens":%d}`, s, tokens)
				sent += tokens
			}
		}
		for _, tr := range trs {
			tr.sync()
		}
	}
	stepAll(1, 15)
	victim, survivor := reps[0], reps[1]
	if inUse(statuses[0]) == reps[1].addr {
		victim, survivor = reps[1], reps[0]
	}
	victim.p.stop(syscall.SIGKILL)
	stepAll(16, 20)
	survivor.eventually("agent any-a on the surviving replica", func() bool {
		up := uplinkStatus(statuses[0])
		return up["collector_in_use"] == survivor.addr && up["connected"] == true
	})
	for _, tr := range trs {
		tr.send(`{"event":"run_end","run_id":"any-run"}`)
		tr.sync()
	}

	survivor.waitEnded("any-run")
	row := survivor.csvRow("any-run")
	if row["tokens_processed"] != fmt.Sprint(sent) {
		t.Errorf("tokens_processed %s, want exactly %d", row["tokens_processed"], sent)
	}
	if row["nodes"] != "2" || row["complete"] != "yes" || row["lost_batches"] != "0" {
		t.Errorf("nodes %q complete %q lost_batches %q, want 2, yes and 0", row["nodes"], row["complete"], row["lost_batches"])
	}
	if num(t, row, "energy_J") <= 0 {
		t.Errorf("energy_J %s, want the sim GPUs' energy", row["energy_J"])
	}

	victim.start()
	want := survivor.cli("report", "any-run", "--json")
	if got := victim.cli("report", "any-run", "--json"); got != want {
		t.Errorf("report --json differs between replicas:\n--- %s (killed, started again)\n%s\n--- %s\n%s", victim.addr, got, survivor.addr, want)
	}
}
