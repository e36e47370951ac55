package agentconfig

import (
	"fmt"
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

func TestCollectorModeAnyFromYAMLAndItsChecks(t *testing.T) {
	cfg, err := loadYAML(t, "collector: [a.example:7433, b.example:7433]\ncollector_mode: any\nnode: n1\n")
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err != nil || !cfg.AnyCollector() {
		t.Fatalf("mode any: %v (any %v)", err, cfg.AnyCollector())
	}
	if got := cfg.SpoolCursors(); !slices.Equal(got, []string{"any"}) {
		t.Errorf("mode any: spool cursors %q, want one", got)
	}
	if def := DefaultConfig(); def.CollectorMode != "all" || def.AnyCollector() {
		t.Errorf("default mode %q, want all", def.CollectorMode)
	}

	// Replicas may be more than a spool has cursors; a bad mode is named.
	cfg.Collector = "1:1,2:1,3:1,4:1,5:1,6:1,7:1,8:1,9:1"
	if err := cfg.Validate(); err != nil {
		t.Errorf("mode any, 9 collectors: %v", err)
	}
	cfg.CollectorMode = "one"
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), `collector_mode "one": want all`) {
		t.Errorf("a bad mode: %v", err)
	}
}

// Agents given the same list start on different replicas (by node name),
// each trying the others in turn after its first.
func TestCollectorAnyOrderSpreadsNodesOverTheList(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Collector, cfg.CollectorMode = "a:1,b:1,c:1", "any"
	firsts := map[string]bool{}
	for i := range 30 {
		cfg.Node = fmt.Sprintf("node-%d", i)
		order := cfg.AnyOrder()
		firsts[order[0]] = true
		at := slices.Index(cfg.Collectors(), order[0])
		if want := slices.Concat(cfg.Collectors()[at:], cfg.Collectors()[:at]); !slices.Equal(order, want) {
			t.Fatalf("node %s: order %q, want %q", cfg.Node, order, want)
		}
	}
	if len(firsts) != 3 {
		t.Errorf("30 nodes start on %v, want each of the 3", firsts)
	}
}
