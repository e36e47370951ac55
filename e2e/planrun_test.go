package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/trainmeter/trainmeter/internal/testkit"
	"github.com/trainmeter/trainmeter/pkg/tlsfiles"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// TestPlanRunOfAnotherCapsNothing, with the real binaries and tokens: a
// reader who calls PlanRun with a $0.01 cap for a run id they do not start
// does not stop that run when its owner starts it (its run_start does not
// present the plan's key); `trainmeter run --max-cost` with the read token
// still stops its own run.
func TestPlanRunOfAnotherCapsNothing(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	const (
		nodeTok  = "e2e-plan-node-token-41c2"
		readTok  = "e2e-plan-read-token-9d0f"
		adminTok = "e2e-plan-admin-token-77e1"
	)
	file := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	addr := testkit.FreeAddr(t)
	// $3,600 a GPU-hour: a run on the sim GPU costs $1 a second.
	daemon(t, "trainmeter", "serve", "--listen", addr, "--data", filepath.Join(dir, "data"), "--gpu-price-per-hour", "3600",
		"--ingest-tokens", file("ingest.yaml", "plan-node: "+nodeTok+"\n"),
		"--read-token-file", file("read.token", readTok+"\n"), "--admin-token-file", file("admin.token", adminTok+"\n"))
	readCreds, err := tlsfiles.StaticToken(readTok, true)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithPerRPCCredentials(readCreds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	c := &cluster{t: t, addr: addr, q: trainmeterv1.NewQueryServiceClient(conn)}
	c.eventually("collector answering", func() bool {
		_, err := c.q.ListRuns(context.Background(), &trainmeterv1.ListRunsRequest{})
		return err == nil
	})
	sock := c.startAgent("plan-node", "sim:1", "--token-file", file("agent.token", nodeTok+"\n"))
	c.waitStreaming("plan-node")

	// The attacker: the read token, another user's predictable run id.
	resp, err := trainmeterv1.NewBudgetServiceClient(conn).PlanRun(context.Background(), &trainmeterv1.PlanRunRequest{RunId: "victim-job", MaxCostUsd: 0.01})
	if err != nil {
		t.Fatalf("PlanRun with the read token: %v", err)
	}
	t.Logf("the attacker's plan was accepted (key %d chars): it must cap nothing", len(resp.GetPlanKey()))

	run := func(args ...string) (string, int, time.Duration) {
		cmd := exec.Command(filepath.Join(binDir, "trainmeter"), append([]string{"run", "--socket", sock, "--collector", addr}, args...)...)
		cmd.Env = append(os.Environ(), "TRAINMETER_TOKEN="+readTok)
		var errb strings.Builder
		cmd.Stderr = &errb
		start := time.Now()
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatalf("trainmeter run: %v", err)
		}
		return errb.String(), code, time.Since(start)
	}
	// The victim: no cap of their own; 4 s at $1/s is 400 times the
	// attacker's cap.
	errOut, code, took := run("--run-id", "victim-job", "--", "sleep", "4")
	if code != 0 || strings.Contains(errOut, "max-cost") || took < 4*time.Second {
		t.Errorf("the victim's run: exit %d after %v, stderr:\n%s", code, took, errOut)
	}
	r := c.waitEnded("victim-job")
	if strings.HasPrefix(r.GetEndStatus(), "stopped") || r.MaxCostUsd != nil {
		t.Errorf("the victim's run ended %q with max cost %v: the attacker's plan applied", r.GetEndStatus(), r.MaxCostUsd)
	}
	if alerts, err := trainmeterv1.NewBudgetServiceClient(conn).ListAlerts(context.Background(), &trainmeterv1.ListAlertsRequest{Kind: "max-cost"}); err != nil || len(alerts.GetAlerts()) != 0 {
		t.Errorf("max-cost alerts %v, %v: want none", alerts.GetAlerts(), err)
	}

	// Its own cap, with the read token: stopped once it cost $1.
	errOut, code, took = run("--run-id", "own-job", "--max-cost", "1", "--stop-grace", "2s", "--", "sleep", "60")
	if !strings.Contains(errOut, "max-cost $1.00 reached") || took > 30*time.Second {
		t.Errorf("own capped run: exit %d after %v, want a max-cost stop; stderr:\n%s", code, took, errOut)
	}
	r = c.waitEnded("own-job")
	if r.GetEndStatus() != "stopped: max-cost" || r.GetMaxCostUsd() != 1 {
		t.Errorf("own capped run ended %q with max cost %v, want stopped: max-cost at $1", r.GetEndStatus(), r.GetMaxCostUsd())
	}
}

// TestPairMaxCostBoundOnBoth: `trainmeter run --max-cost` given a pair sends
// one plan key to both collectors, and its run_start presents it to both:
// each applies the cap (shows it in the report, fires the max-cost alert).
func TestPairMaxCostBoundOnBoth(t *testing.T) {
	t.Parallel()
	// $3,600 a GPU-hour: $1 a second on the one sim GPU.
	a, b := startCollector(t, "--gpu-price-per-hour", "3600"), startCollector(t, "--gpu-price-per-hour", "3600")
	sock, _ := pairAgent(t, a, b, "sim:1")
	a.waitStreaming("n")
	b.waitStreaming("n")
	cmd := exec.Command(filepath.Join(binDir, "trainmeter"), "run", "--socket", sock, "--collector", a.addr+","+b.addr,
		"--run-id", "pair-capped", "--max-cost", "1", "--stop-grace", "2s", "--", "sleep", "60")
	var errb strings.Builder
	cmd.Stderr = &errb
	_ = cmd.Run()
	if !strings.Contains(errb.String(), "max-cost $1.00 reached") {
		t.Errorf("trainmeter run was not stopped by its cap; stderr:\n%s", errb.String())
	}
	for _, c := range []*cluster{a, b} {
		r := c.waitEnded("pair-capped")
		if r.GetMaxCostUsd() != 1 {
			t.Errorf("collector %s: max cost %v, want the run's $1 plan applied", c.addr, r.MaxCostUsd)
		}
		c.eventually("max-cost alert on "+c.addr, func() bool {
			out := c.cli("alerts", "--kind", "max-cost", "--json")
			return strings.Contains(out, `"scope": "run:pair-capped"`)
		})
	}
}
