package agentconfig

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestAttributionSection(t *testing.T) {
	cfg := DefaultConfig()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	if cfg.Attribution != DefaultAttribution() {
		t.Errorf("default %+v", cfg.Attribution)
	}
	path := filepath.Join(t.TempDir(), "agent.yaml")
	if err := os.WriteFile(path, []byte("attribution:\n  slurm: off\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := LoadConfigFile(path, &cfg); err != nil {
		t.Fatal(err)
	}
	want := AttributionConfig{Processes: SourceAuto, Slurm: SourceOff, Kubernetes: SourceAuto}
	if cfg.Attribution != want || cfg.Validate() != nil {
		t.Errorf("after %s: %+v (%v), want %+v", path, cfg.Attribution, cfg.Validate(), want)
	}
	cfg.Attribution.Processes, cfg.Attribution.Kubernetes = "no", ""
	err := cfg.Validate()
	for _, s := range []string{`attribution.processes "no": want auto or off`, `attribution.kubernetes "": want auto or off`} {
		if err == nil || !strings.Contains(err.Error(), s) {
			t.Errorf("Validate: %v, want %q", err, s)
		}
	}
}
