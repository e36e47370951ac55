package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/trainmeter/trainmeter/internal/testkit"
)

// TestServeConfigCheck: `serve --config F --check` with the real binary
// exits 0 and says OK for the shipped collector.yaml, and exits non-zero
// naming each bad section's problem and an unknown key by file and line;
// then a collector runs from a file, a flag overriding its listen address.
func TestServeConfigCheck(t *testing.T) {
	bin := filepath.Join(binDir, "trainmeter")
	shipped := "../deploy/etc/trainmeter/collector.yaml"
	out, err := exec.CommandContext(t.Context(), bin, "serve", "--config", shipped, "--check").CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != shipped+": OK" {
		t.Fatalf("--check of the shipped collector.yaml: %v\n%s", err, out)
	}

	dir := t.TempDir()
	bad := filepath.Join(dir, "collector.yaml")
	if err := os.WriteFile(bad, []byte("store:\n  commit_window: 5s\nbudgets:\n  timezone: Mars/Olympus\n  evaluate: 1s\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err = exec.CommandContext(t.Context(), bin, "serve", "--config", bad, "--check").CombinedOutput()
	if err == nil {
		t.Fatalf("--check of an invalid config exited 0:\n%s", out)
	}
	for _, want := range []string{bad + ":5: unknown key \"evaluate\" in section budgets", "store: commit_window 5s", "budgets: budget timezone \"Mars/Olympus\""} {
		if !strings.Contains(string(out), want) {
			t.Errorf("--check output lacks %q:\n%s", want, out)
		}
	}

	good := filepath.Join(dir, "good.yaml")
	if err := os.WriteFile(good, []byte("server: {listen: \"127.0.0.1:1\"}\nstore: {data: "+filepath.Join(dir, "data")+"}\nconsole: {listen: \"\"}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// collectorAt waits until the collector answers on --listen's address:
	// the flag wins over the file's 127.0.0.1:1.
	collectorAt(t, testkit.FreeAddr(t), filepath.Join(dir, "data"), "--config", good)
}
