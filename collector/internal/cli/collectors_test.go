package cli

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/trainmeter/trainmeter/collector/internal/server"
	tu "github.com/trainmeter/trainmeter/collector/internal/testutil"
	"github.com/trainmeter/trainmeter/internal/testkit"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

func runSplit(t *testing.T, env map[string]string, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	cmd := NewRootCommand(func(k string) string { return env[k] })
	var out, errOut bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SetArgs(args)
	err = cmd.ExecuteContext(t.Context())
	return out.String(), errOut.String(), err
}

// silentAddr accepts TCP connections (the kernel does, without Accept) but
// never speaks gRPC: a collector host that hangs.
func silentAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l.Addr().String()
}

func TestSeveralCollectorsTheFirstThatAnswersIsUsed(t *testing.T) {
	live := liveCollector(t)
	down := testkit.FreeAddr(t)
	hung := silentAddr(t)
	for name, args := range map[string][]string{
		"comma":          {"runs", "--json", "--collector", down + "," + live},
		"repeated":       {"runs", "--json", "--collector", down, "--collector", live},
		"hung then live": {"runs", "--json", "--collector", hung + "," + live, "--connect-timeout", "300ms"},
	} {
		start := time.Now()
		out, errOut, err := runSplit(t, nil, args...)
		if err != nil {
			t.Fatalf("%s: %v\n%s", name, err, errOut)
		}
		if !strings.Contains(out, `"run-a"`) {
			t.Errorf("%s: runs from the live collector missing:\n%s", name, out)
		}
		if errOut != "" {
			t.Errorf("%s: stderr without -v: %q", name, errOut)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("%s: took %v", name, d)
		}
	}
	out, _, err := runSplit(t, map[string]string{EnvCollector: down + "," + live}, "runs", "--json")
	if err != nil || !strings.Contains(out, `"run-a"`) {
		t.Errorf("$%s with two addresses: %v\n%s", EnvCollector, err, out)
	}
}

func TestSeveralCollectorsVerboseSaysWhichOnStderrOnly(t *testing.T) {
	live := liveCollector(t)
	down := testkit.FreeAddr(t)
	out, errOut, err := runSplit(t, nil, "runs", "--json", "-v", "--collector", down+","+live)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(errOut, "collector "+live+" (the first of") || !strings.Contains(errOut, down+" refused") {
		t.Errorf("-v stderr does not say which collector answered and which did not:\n%s", errOut)
	}
	if strings.Contains(out, live) || strings.Contains(out, down) {
		t.Errorf("stdout names a collector (it must stay parseable JSON):\n%s", out)
	}
}

func TestSeveralCollectorsNoneAnswersNamesEach(t *testing.T) {
	down, hung := testkit.FreeAddr(t), silentAddr(t)
	_, _, err := runSplit(t, nil, "runs", "--collector", down+","+hung, "--connect-timeout", "200ms")
	if err == nil {
		t.Fatal("no error with no collector up")
	}
	for _, want := range []string{"no collector answered", down + " refused", hung + " did not answer within 200ms"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if _, _, err := runSplit(t, nil, "runs", "--collector", down+",http://x:1"); err == nil || !strings.Contains(err.Error(), "is a URL") {
		t.Errorf("a malformed second address: %v", err)
	}
}

// A change (budget set, budget delete, delete-run) goes to every collector
// of a pair, so that both keep the same budgets; it is printed once, and one
// collector being down is said, with what to run when it is back.
func TestSeveralCollectorsChangesGoToEach(t *testing.T) {
	a, b := liveCollector(t), liveCollector(t)
	out, errOut, err := runSplit(t, nil, "budget", "set", "team:nlp", "100", "--collector", a+","+b)
	if err != nil {
		t.Fatalf("%v\n%s", err, errOut)
	}
	if strings.Count(out, "team:nlp") != 1 {
		t.Errorf("budget set printed %d times:\n%s", strings.Count(out, "team:nlp"), out)
	}
	for _, addr := range []string{a, b} {
		if got, _, err := runSplit(t, nil, "budget", "--json", "--collector", addr); err != nil || !strings.Contains(got, `"team:nlp"`) {
			t.Errorf("collector %s lacks the budget: %v\n%s", addr, err, got)
		}
	}
	if _, _, err := runSplit(t, nil, "delete-run", "run-a", "--yes", "--collector", a+","+b); err != nil {
		t.Fatal(err)
	}
	for _, addr := range []string{a, b} {
		if got, _, _ := runSplit(t, nil, "runs", "--json", "--collector", addr); strings.Contains(got, `"run-a"`) {
			t.Errorf("collector %s still has the deleted run", addr)
		}
	}

	down := testkit.FreeAddr(t)
	_, _, err = runSplit(t, nil, "budget", "set", "team:cv", "50", "--collector", a+","+down)
	if err == nil || !strings.Contains(err.Error(), "budget set done on "+a+" but not on "+down) ||
		!strings.Contains(err.Error(), "--collector "+down+" once it answers") {
		t.Errorf("budget set with one of the pair down: %v", err)
	}
	if got, _, _ := runSplit(t, nil, "budget", "--json", "--collector", a); !strings.Contains(got, `"team:cv"`) {
		t.Errorf("the collector that is up did not get the budget:\n%s", got)
	}
}

// Set on a pair, a budget has one id on both, so their alerts for it carry
// the same ids (and webhooks the same Idempotency-Key).
func TestSeveralCollectorsBudgetHasOneIDOnBoth(t *testing.T) {
	a, b := liveCollector(t), liveCollector(t)
	if _, errOut, err := runSplit(t, nil, "budget", "set", "model:tiny", "10", "--collector", a+","+b); err != nil {
		t.Fatalf("%v\n%s", err, errOut)
	}
	ids := map[string]bool{}
	for _, addr := range []string{a, b} {
		out, _, err := runSplit(t, nil, "budget", "--json", "--collector", addr)
		if err != nil {
			t.Fatal(err)
		}
		i := strings.Index(out, `"id": "`)
		if i < 0 {
			t.Fatalf("no budget id in:\n%s", out)
		}
		ids[out[i:i+len(`"id": "`)+16]] = true
	}
	if len(ids) != 1 {
		t.Errorf("the pair names the budget differently: %v", ids)
	}
}

// trainmeter run's live status, given a pair, moves to the other collector
// when the one it used stops answering.
func TestRunStatusMovesToTheOtherCollectorOfAPair(t *testing.T) {
	first := server.New(server.Config{Listen: "127.0.0.1:0", DataDir: t.TempDir(), GPUPricePerHour: 2, Clock: tu.Clock()},
		slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err := first.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	stopFirst := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = first.Shutdown(ctx)
	}
	defer stopFirst()
	second := liveCollector(t) // holds run-a
	var errOut bytes.Buffer
	cf := &clientFlags{addrs: []string{first.Addr().String(), second}, connectTimeout: time.Second,
		getenv: func(string) string { return "" }}
	o := &runOptions{runID: "run-a", collectors: 2, stderr: &errOut}
	o.query = func() (trainmeterv1.QueryServiceClient, func(), error) {
		conn, err := cf.dial(context.Background(), o.stderr)
		if err != nil {
			return nil, nil, err
		}
		return trainmeterv1.NewQueryServiceClient(conn), func() { conn.Close() }, nil
	}
	s := newStatus(o, true)
	defer func() { s.close() }()
	if cf.addr != first.Addr().String() {
		t.Fatalf("status uses %s, want the first collector", cf.addr)
	}
	stopFirst()
	s.poll()
	if out := errOut.String(); !strings.Contains(out, "trainmeter run-a") || strings.Contains(out, "waiting for the collector") ||
		strings.Contains(out, "cannot reach") {
		t.Errorf("status after the first collector stopped:\n%s", out)
	}
	if cf.addr != second {
		t.Errorf("status uses %s, want the second collector %s", cf.addr, second)
	}
}
