package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/trainmeter/trainmeter/agent/internal/agent"
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

func parse(t *testing.T, args ...string) (agent.Config, error) {
	t.Helper()
	o := &options{cfg: agent.DefaultConfig()}
	cmd := newRootCmdWith(o)
	if err := cmd.ParseFlags(args); err != nil {
		t.Fatal(err)
	}
	return resolveConfig(cmd, o.configFile, o.cfg)
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
