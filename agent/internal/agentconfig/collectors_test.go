package agentconfig

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func loadYAML(t *testing.T, body string) (Config, error) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "agent.yaml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	err := LoadConfigFile(p, &cfg)
	return cfg, err
}

func TestCollectorPairFromAYAMLListOrACommaString(t *testing.T) {
	for name, body := range map[string]string{
		"list":   "collector:\n  - a.example:7433\n  - b.example:7433\nnode: n1\n",
		"inline": "collector: [a.example:7433, b.example:7433]\n",
		"string": "collector: a.example:7433, b.example:7433\n",
	} {
		cfg, err := loadYAML(t, body)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if got := cfg.Collectors(); !slices.Equal(got, []string{"a.example:7433", "b.example:7433"}) {
			t.Errorf("%s: collectors %q", name, got)
		}
		if err := cfg.Validate(); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func TestCollectorListKeepsUnknownKeysAnError(t *testing.T) {
	if _, err := loadYAML(t, "collector: [a:1, b:1]\ncolector: x\n"); err == nil || !strings.Contains(err.Error(), "colector") {
		t.Errorf("a typo beside a collector list: %v", err)
	}
}

func TestCollectorPairBadListsAreRefusedWithTheFix(t *testing.T) {
	for list, want := range map[string]string{
		"a:1,a:1":                             "listed twice",
		"a:1,":                                "address 2 of 2 is empty",
		"a:1,http://b:1":                      "is a URL",
		"a:1,b":                               "has no port",
		"1:1,2:1,3:1,4:1,5:1,6:1,7:1,8:1,9:1": "at most 8",
	} {
		cfg := DefaultConfig()
		cfg.Collector = list
		err := cfg.Validate()
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("collector %q: %v, want an error saying %q", list, err, want)
		}
	}
	if _, err := loadYAML(t, "collector: []\n"); err == nil || !strings.Contains(err.Error(), "empty") {
		t.Errorf("an empty list: %v", err)
	}
}
