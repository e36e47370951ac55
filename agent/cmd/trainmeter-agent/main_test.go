package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/trainmeter/trainmeter/agent/internal/agentconfig"
)

func writeConfig(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "agent.yaml")
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestConfigFileIsTheBaseAndFlagsWin(t *testing.T) {
	path := writeConfig(t, "collector: collector.example:7433\nsocket: /tmp/from-file.sock\ngpu: sim:4\ninterval: 100ms\nwarmup: 30s\nnode: gpu-box-7\n")
	cfg, err := parse(t, "--config", path, "--gpu", "sim:2", "--warmup", "5s")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Collector != "collector.example:7433" || cfg.Socket != "/tmp/from-file.sock" || cfg.Node != "gpu-box-7" || cfg.Interval != 100*time.Millisecond {
		t.Errorf("values from the file lost: %+v", cfg)
	}
	if cfg.GPU != "sim:2" || cfg.Warmup != 5*time.Second {
		t.Errorf("flags did not override the file: gpu %q warmup %v", cfg.GPU, cfg.Warmup)
	}
}

func TestConfigFileErrorsAreClear(t *testing.T) {
	for _, tc := range []struct{ body, want string }{
		{"colector: x:1\n", "field colector not found"},
		{"interval: 0s\n", "interval 0s: want between 1ms and 10s"},
		{"collector: [\n", "config"},
	} {
		_, err := parse(t, "--config", writeConfig(t, tc.body))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("config %q: err %v, want %q", tc.body, err, tc.want)
		}
	}
}

func parse(t *testing.T, args ...string) (agentconfig.Config, error) {
	t.Helper()
	o := &options{cfg: agentconfig.DefaultConfig()}
	cmd := newRootCmdWith(o)
	if err := cmd.ParseFlags(args); err != nil {
		t.Fatal(err)
	}
	cfg, err := o.load(cmd)
	if err != nil {
		return cfg, err
	}
	return cfg, cfg.Validate()
}

func TestShippedExampleConfigIsValid(t *testing.T) {
	cfg, err := parse(t, "--config", "../../../deploy/examples/agent.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Interval != 50*time.Millisecond || cfg.Warmup != time.Minute || cfg.SocketGroup != "trainmeter" {
		t.Errorf("example config read as %+v", cfg)
	}
}

func TestDoctorSharesTheAgentsFlagsAndConfig(t *testing.T) {
	dir := t.TempDir()
	path := writeConfig(t, "collector: 127.0.0.1:1\nsocket: "+filepath.Join(dir, "from-file.sock")+"\ngpu: nvml\nnode: gpu-box-7\nspool: "+filepath.Join(dir, "spool")+"\n")
	cmd := newRootCmd()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetArgs([]string{"doctor", "--config", path, "--gpu", "sim:1", "--json", "--timeout", "1s", "--sysfs-root", "../../internal/rapl/testdata/two-sockets"})
	err := cmd.Execute()
	var failed doctorFailed
	if !errors.As(err, &failed) || failed.n != 2 {
		t.Fatalf("err %v, want 2 failed checks (no socket, no collector)\n%s", err, out.String())
	}
	var rep struct {
		Node, GPU, Socket, Collector string
		OK                           bool
	}
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("%v:\n%s", err, out.String())
	}
	if rep.Node != "gpu-box-7" || rep.GPU != "sim:1" || rep.Socket != filepath.Join(dir, "from-file.sock") || rep.Collector != "127.0.0.1:1" || rep.OK {
		t.Errorf("doctor ran with %+v", rep)
	}
}

// --check validates the file and the flags and exits: OK and nil for the
// shipped /etc/trainmeter/agent.yaml, every problem for a bad one; it
// starts nothing (no GPU is opened).
func TestCheckValidatesAndExits(t *testing.T) {
	check := func(args ...string) (string, error) {
		cmd := newRootCmd()
		var out bytes.Buffer
		cmd.SetOut(&out)
		cmd.SetArgs(append([]string{"--check"}, args...))
		err := cmd.Execute()
		return out.String(), err
	}
	shipped := "../../../deploy/etc/trainmeter/agent.yaml"
	if out, err := check("--config", shipped); err != nil || out != shipped+": OK\n" {
		t.Fatalf("shipped agent.yaml: %q, %v", out, err)
	}
	out, err := check("--config", writeConfig(t, "interval: 0s\nlog_level: loud\n"), "--socket-max-conns-per-uid", "0")
	for _, want := range []string{"interval 0s", "log_level \"loud\"", "socket_max_conns_per_uid 0"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("check of a bad config: %v, want %q", err, want)
		}
	}
	if strings.Contains(out, "OK") {
		t.Errorf("a bad config printed %q", out)
	}
}
