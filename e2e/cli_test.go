package e2e

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// runBinary runs one of the real binaries and returns stdout, stderr and
// the exit code.
func runBinary(t *testing.T, env []string, name string, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(filepath.Join(binDir, name), args...)
	cmd.Env = append(os.Environ(), env...)
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		return out.String(), errb.String(), ee.ExitCode()
	case err != nil:
		t.Fatalf("%s %v: %v", name, args, err)
	}
	return out.String(), errb.String(), 0
}

func TestVersionFlags(t *testing.T) {
	for _, bin := range []string{"trainmeter", "trainmeter-agent"} {
		out, errOut, code := runBinary(t, nil, bin, "--version")
		if code != 0 || !regexp.MustCompile(`^`+bin+` version \S+\n$`).MatchString(out) {
			t.Errorf("%s --version: exit %d, stdout %q, stderr %q", bin, code, out, errOut)
		}
	}
}

// TestCLIErrorsSayWhatToDo: each mistake of a first hour with the CLI
// exits 1 with an error that says what to type instead, through the real
// binary (never the help with exit 0, which a script takes for success).
func TestCLIErrorsSayWhatToDo(t *testing.T) {
	c := startCollector(t) // no price provider
	env := []string{"TRAINMETER_COLLECTOR=" + c.addr}
	ran := filepath.Join(t.TempDir(), "ran") // the command of a refused `trainmeter run` must not run
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"negative budget", []string{"budget", "set", "team:nlp", "-5"},
			[]string{"budget amount -5", "a number of USD above 0", "trainmeter budget delete SCOPE"}},
		{"collector without port", []string{"runs", "--collector", "localhost"},
			[]string{`collector address "localhost" has no port`, "e.g. localhost:7433", "--collector or $TRAINMETER_COLLECTOR"}},
		{"run with a collector without port", []string{"run", "--collector", "localhost", "--", "touch", ran},
			[]string{`collector address "localhost" has no port`}},
		{"collector as URL", []string{"runs", "--collector", "http://" + c.addr},
			[]string{`collector address "http://` + c.addr + `" is a URL`, "without http://, e.g. " + c.addr}},
		{"prices fetch without provider", []string{"prices", "fetch"},
			[]string{"no price provider configured", "trainmeter serve --price-provider vastai", "--price-file FILE", "trainmeter prices import FILE"}},
		{"max offer age not longer than the fetch interval", []string{"serve", "--data", filepath.Join(t.TempDir(), "data"), "--price-max-age", "30m"},
			[]string{"--price-max-age", "30m0s must be longer than the fetch interval (--price-fetch-interval) 1h0m0s"}},
		{"export json", []string{"export", "json"},
			[]string{`unknown export format "json"`, "knows csv", "trainmeter runs --json"}},
		{"export without format", []string{"export"},
			[]string{"export needs a format: trainmeter export csv"}},
		{"out in a missing directory", []string{"export", "csv", "--out", "/nonexistent/x.csv"},
			[]string{"--out /nonexistent/x.csv: directory /nonexistent does not exist", "mkdir -p /nonexistent"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, errOut, code := runBinary(t, env, "trainmeter", tc.args...)
			if code != 1 {
				t.Errorf("exit %d, want 1\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
			}
			for _, w := range tc.want {
				if !strings.Contains(errOut, w) {
					t.Errorf("stderr lacks %q:\n%s", w, errOut)
				}
			}
			if strings.Contains(errOut, ".tmp-") {
				t.Errorf("stderr names a temporary file:\n%s", errOut)
			}
		})
	}
	if _, err := os.Stat(ran); err == nil {
		t.Error("trainmeter run with a bad --collector ran its command")
	}
}

// TestRunLabelsAndBudgetScope: `trainmeter run --label --budget-scope`
// reaches the collector through the real agent; `runs --label`, `--model`
// and `--json` find the run.
func TestRunLabelsAndBudgetScope(t *testing.T) {
	c := startCollector(t)
	sock := c.startAgent("label-node", "sim:1")
	c.waitStreaming("label-node")
	out, errOut, code := c.trainmeterRun("--socket", sock, "--collector", c.addr, "--run-id", "lab1", "--model", "m1",
		"--label", "team=nlp", "--label", "env=ci", "--budget-scope", "nlp-q4", "--", "true")
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	if out, errOut, code := c.trainmeterRun("--socket", sock, "--collector", c.addr, "--run-id", "lab2", "--model", "m2", "--", "true"); code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	c.waitEnded("lab1")
	c.waitEnded("lab2")

	var resp struct {
		Runs []struct {
			RunID       string            `json:"run_id"`
			Labels      map[string]string `json:"labels"`
			BudgetScope string            `json:"budget_scope"`
			Gpus        any               `json:"gpus"`
		} `json:"runs"`
	}
	js := c.cli("runs", "--json", "--label", "team=nlp")
	if err := json.Unmarshal([]byte(js), &resp); err != nil {
		t.Fatalf("%v\n%s", err, js)
	}
	if len(resp.Runs) != 1 || resp.Runs[0].RunID != "lab1" || resp.Runs[0].Labels["team"] != "nlp" || resp.Runs[0].Labels["env"] != "ci" ||
		resp.Runs[0].BudgetScope != "nlp-q4" {
		t.Fatalf("runs --json --label team=nlp:\n%s", js)
	}
	if g, ok := resp.Runs[0].Gpus.(float64); !ok || g != 1 {
		t.Errorf("gpus %#v, want the number 1", resp.Runs[0].Gpus)
	}
	table := c.cli("runs", "--model", "m2")
	if !strings.Contains(table, "lab2") || strings.Contains(table, "lab1") ||
		!regexp.MustCompile(`lab2 +m2 +- +ok +\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z `).MatchString(table) {
		t.Errorf("runs --model m2:\n%s", table)
	}
	if _, errOut, code := c.trainmeterRun("--socket", sock, "--label", "team", "--", "true"); code != 1 || !strings.Contains(errOut, `--label "team": want KEY=VALUE`) {
		t.Errorf("--label without =: exit %d\n%s", code, errOut)
	}
	if _, errOut, code := c.trainmeterRun("--socket", sock, "--label", "model=x", "--", "true"); code != 1 || !strings.Contains(errOut, `"model" is a run_start field, not a label`) {
		t.Errorf("--label model=x: exit %d\n%s", code, errOut)
	}
}
