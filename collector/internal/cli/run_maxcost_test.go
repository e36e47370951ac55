package cli

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// stoppingAgent answers every run_start with a budget stop and then a
// max-cost stop, as the agent relays the collector's advice, and records
// the run_end status.
func stoppingAgent(t *testing.T) (path string, status func() string) {
	t.Helper()
	ag := newFakeAgent(t) // for a short socket directory only
	ag.ln.Close()
	ag.wg.Wait()
	ln, err := net.Listen("unix", ag.path)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var end string
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				sc := bufio.NewScanner(c)
				for sc.Scan() {
					var m map[string]string
					_ = json.Unmarshal(sc.Bytes(), &m)
					switch m["event"] {
					case "run_start":
						_, _ = c.Write([]byte(`{"event":"stop","run_id":"r1","reason":"budget team:x exceeded (101%)"}` + "\n" +
							`{"event":"stop","run_id":"r1","reason":"max-cost $1.00 reached ($1.2000 spent)"}` + "\n"))
					case "run_end":
						mu.Lock()
						end = m["status"]
						mu.Unlock()
					}
				}
			}()
		}
	}()
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	return ag.path, func() string { mu.Lock(); defer mu.Unlock(); return end }
}

// TestMaxCostAdviceStopsTheCommand: with --max-cost, the collector's
// max-cost stop ends the command (SIGTERM) and the run ends "stopped:
// max-cost"; a budget stop is still only shown.
func TestMaxCostAdviceStopsTheCommand(t *testing.T) {
	path, status := stoppingAgent(t)
	o, _, errb := testOptions(path)
	o.maxCost, o.stopGrace = 1, 10*time.Second
	start := time.Now()
	code := runCommand(o, []string{"sleep", "30"})
	if code != 128+15 || time.Since(start) > 20*time.Second {
		t.Fatalf("exit %d after %v, want 143 (SIGTERM) well before the command's 30 s", code, time.Since(start))
	}
	if status() != "stopped: max-cost" {
		t.Errorf("run_end status %q, want stopped: max-cost", status())
	}
	for _, want := range []string{"agent asks the run to stop: budget team:x exceeded", "max-cost $1.00 reached ($1.2000 spent): stopping the command"} {
		if !strings.Contains(errb.String(), want) {
			t.Errorf("stderr lacks %q:\n%s", want, errb.String())
		}
	}
}

// TestNoCapNoStop: without --max-cost, the same advice stops nothing.
func TestNoCapNoStop(t *testing.T) {
	path, status := stoppingAgent(t)
	o, _, errb := testOptions(path)
	if code := runCommand(o, []string{"sh", "-c", "sleep 1; exit 0"}); code != 0 {
		t.Fatalf("exit %d", code)
	}
	if status() != "exit 0" || strings.Contains(errb.String(), "stopping the command") {
		t.Errorf("status %q, stderr:\n%s", status(), errb.String())
	}
}

func TestPlanRunAtStart(t *testing.T) {
	o, _, errb := testOptions("/nonexistent.sock")
	o.maxCost = 10
	o.estimate = &trainmeterv1.EstimateRequest{Model: "m", Tokens: 1000}
	var got *trainmeterv1.PlanRunRequest
	o.plan = func(req *trainmeterv1.PlanRunRequest) (*trainmeterv1.PlanRunResponse, error) {
		got = req
		return &trainmeterv1.PlanRunResponse{PlanKey: req.GetPlanKey(), Estimate: &trainmeterv1.RunEstimate{Model: "m", Tokens: 1000, Gpus: 1, BasedOn: []string{"a"},
			CostUsd: &trainmeterv1.Range{Low: 12, Mid: 15, High: 20}, WallS: &trainmeterv1.Range{}, GpuHours: &trainmeterv1.Range{}, EnergyKwh: &trainmeterv1.Range{}}}, nil
	}
	planRun(o, func(f string, a ...any) {
		errb.Write([]byte("trainmeter: " + strings.TrimSpace(fmt.Sprintf(f, a...)) + "\n"))
	})
	if got.GetRunId() != "r1" || got.GetMaxCostUsd() != 10 || got.GetEstimate().GetTokens() != 1000 {
		t.Errorf("PlanRun request %v", got)
	}
	// The plan applies only to the run whose run_start presents its key.
	if len(got.GetPlanKey()) != 32 {
		t.Errorf("plan key %q, want 32 random hex digits", got.GetPlanKey())
	}
	if line := string(newAgentLink(o, func(string, ...any) {}).start0); !strings.Contains(line, `"plan_key":"`+got.GetPlanKey()+`"`) {
		t.Errorf("run_start %s does not present the plan key", line)
	}
	for _, want := range []string{"cost        $15.00 ($12.00 to $20.00)", "the estimate ($15.00) is above --max-cost ($10.00)", "run r1 is capped at $10.00"} {
		if !strings.Contains(errb.String(), want) {
			t.Errorf("stderr lacks %q:\n%s", want, errb.String())
		}
	}
	o.plan = func(*trainmeterv1.PlanRunRequest) (*trainmeterv1.PlanRunResponse, error) {
		return nil, errors.New("unreachable")
	}
	planRun(o, func(f string, a ...any) { errb.Write([]byte(fmt.Sprintf(f, a...) + "\n")) })
	if !strings.Contains(errb.String(), "the run is NOT capped") {
		t.Errorf("no warning that the run is not capped:\n%s", errb.String())
	}
}
