// Package e2e runs the real trainmeter and trainmeter-agent binaries
// against each other: a collector with a BadgerDB in a temp dir, agents on
// sim or replay GPUs, and trainers speaking the socket protocol.
package e2e

import (
	"bufio"
	"context"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/trainmeter/trainmeter/internal/oteltest"
	"github.com/trainmeter/trainmeter/internal/testkit"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

var binDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "trainmeter-e2e-bin")
	if err != nil {
		panic(err)
	}
	cmd := exec.Command("go", "build", "-o", dir+"/", "../agent/cmd/trainmeter-agent", "../collector/cmd/trainmeter")
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "e2e: building binaries:", err)
		os.Exit(1)
	}
	binDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// daemon starts a binary in the background and stops it (SIGINT) at cleanup,
// showing its log if the test failed.
func daemon(t *testing.T, name string, args ...string) *exec.Cmd {
	t.Helper()
	return oteltest.Start(t, name, filepath.Join(binDir, name), args...)
}

type cluster struct {
	t    *testing.T
	addr string
	q    trainmeterv1.QueryServiceClient
}

// collectorAt starts a collector on addr with data dir data (so that a test
// can restart it on the same data) and returns it with its process.
func collectorAt(t *testing.T, addr, data string, extra ...string) (*cluster, *exec.Cmd) {
	t.Helper()
	cmd := daemon(t, "trainmeter", append([]string{"serve", "--listen", addr, "--data", data}, extra...)...)
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	c := &cluster{t: t, addr: addr, q: trainmeterv1.NewQueryServiceClient(conn)}
	c.eventually("collector answering", func() bool {
		_, err := c.q.ListRuns(t.Context(), &trainmeterv1.ListRunsRequest{})
		return err == nil
	})
	return c, cmd
}

func startCollector(t *testing.T, extra ...string) *cluster {
	t.Helper()
	c, _ := collectorAt(t, testkit.FreeAddr(t), filepath.Join(t.TempDir(), "data"), extra...)
	return c
}

// startAgent starts an agent and returns its socket path. Its spool is a
// fresh directory under the test's temp dir unless extra has --spool.
func (c *cluster) startAgent(node, gpuSpec string, extra ...string) string {
	c.t.Helper()
	sock := filepath.Join(c.t.TempDir(), "agent.sock")
	args := []string{"--collector", c.addr, "--socket", sock, "--node", node, "--gpu", gpuSpec}
	if !slices.Contains(extra, "--spool") {
		args = append(args, "--spool", filepath.Join(c.t.TempDir(), "spool"))
	}
	args = append(args, extra...)
	daemon(c.t, "trainmeter-agent", args...)
	c.eventually("agent socket "+sock, func() bool {
		conn, err := net.Dial("unix", sock)
		if err == nil {
			conn.Close()
		}
		return err == nil
	})
	return sock
}

// waitStreaming waits until node's agent has had a batch acked: it is
// sampling, and its GPUs' counters have points a run can start from.
func (c *cluster) waitStreaming(node string) {
	c.t.Helper()
	c.eventually("agent "+node+" streaming", func() bool {
		resp, err := c.q.ListNodes(context.Background(), &trainmeterv1.ListNodesRequest{})
		if err != nil {
			return false
		}
		for _, n := range resp.Nodes {
			if n.Node == node && n.LastSeq > 0 {
				return true
			}
		}
		return false
	})
}

func (c *cluster) eventually(what string, ok func() bool) {
	c.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			c.t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (c *cluster) waitEnded(run string) *trainmeterv1.RunReport {
	c.t.Helper()
	var r *trainmeterv1.RunReport
	c.eventually("run "+run+" ended at the collector", func() bool {
		resp, err := c.q.GetRun(context.Background(), &trainmeterv1.GetRunRequest{RunId: run})
		if err != nil {
			return false
		}
		r = resp.Run
		return r.Ended
	})
	return r
}

// endedReports waits until each run has ended and returns its `trainmeter
// report RUN --json`, decoded as the CLI prints it, by run.
func (c *cluster) endedReports(runs ...string) map[string]map[string]any {
	c.t.Helper()
	out := map[string]map[string]any{}
	for _, run := range runs {
		c.waitEnded(run)
		var m map[string]any
		if err := json.Unmarshal([]byte(c.cli("report", run, "--json")), &m); err != nil {
			c.t.Fatalf("report %s --json: %v", run, err)
		}
		out[run] = m
	}
	return out
}

// cli runs the trainmeter CLI against this collector and returns stdout.
func (c *cluster) cli(args ...string) string {
	c.t.Helper()
	cmd := exec.Command(filepath.Join(binDir, "trainmeter"), args...)
	cmd.Env = append(os.Environ(), "TRAINMETER_COLLECTOR="+c.addr)
	out, err := cmd.Output()
	if err != nil {
		stderr := ""
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		c.t.Fatalf("trainmeter %v: %v\n%s", args, err, stderr)
	}
	return string(out)
}

// csvRow exports one run through the CLI and returns its row by column name.
func (c *cluster) csvRow(run string) map[string]string {
	c.t.Helper()
	out := filepath.Join(c.t.TempDir(), "runs.csv")
	c.cli("export", "csv", "--out", out, "--run", run)
	f, err := os.Open(out)
	if err != nil {
		c.t.Fatal(err)
	}
	defer f.Close()
	rows, err := csv.NewReader(f).ReadAll()
	if err != nil {
		c.t.Fatal(err)
	}
	if len(rows) != 2 {
		c.t.Fatalf("export of one run gave %d rows", len(rows))
	}
	m := map[string]string{}
	for i, h := range rows[0] {
		m[h] = rows[1][i]
	}
	return m
}

func num(t *testing.T, row map[string]string, col string) float64 {
	t.Helper()
	v, err := strconv.ParseFloat(row[col], 64)
	if err != nil {
		t.Fatalf("column %s = %q: %v", col, row[col], err)
	}
	return v
}

// trainer is a raw protocol client, as any language would write one.
type trainer struct {
	t    *testing.T
	conn net.Conn
	rd   *bufio.Reader
}

func dialTrainer(t *testing.T, sock string) *trainer {
	t.Helper()
	conn, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &trainer{t: t, conn: conn, rd: bufio.NewReaderSize(conn, 1<<16)}
}

func (tr *trainer) send(format string, args ...any) {
	tr.t.Helper()
	line := fmt.Sprintf(format, args...)
	if !strings.HasSuffix(line, "\n") {
		line += "\n"
	}
	if _, err := tr.conn.Write([]byte(line)); err != nil {
		tr.t.Fatal(err)
	}
}

func (tr *trainer) readLine() string {
	tr.t.Helper()
	_ = tr.conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	line, err := tr.rd.ReadString('\n')
	if err != nil {
		tr.t.Fatalf("reading from agent: %v", err)
	}
	return strings.TrimSpace(line)
}

// sync returns once the agent has handled every line sent before it.
func (tr *trainer) sync() {
	tr.t.Helper()
	tr.send(`{"event":"sync","run_id":"x"}`)
	for {
		line := tr.readLine()
		if strings.Contains(line, `unknown event \"sync\"`) {
			return
		}
		tr.t.Fatalf("unexpected line from agent: %s", line)
	}
}

// runSteps reports n steps of tokens each, spaced by every.
func (tr *trainer) runSteps(run string, n int, tokens int, every time.Duration) {
	for i := 1; i <= n; i++ {
		time.Sleep(every)
		tr.send(`{"event":"step","run_id":%q,"step":%d,"tokens":%d,"compute_s":0.05,"data_wait_s":0.01}`, run, i, tokens)
	}
	tr.sync()
}
