package doctor

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/trainmeter/trainmeter/agent/internal/agentconfig"
)

func raplReport(t *testing.T, sysfs string, readFile func(string) ([]byte, error)) *Report {
	t.Helper()
	cfg := agentconfig.DefaultConfig()
	cfg.SysfsRoot = sysfs
	r := &Report{OK: true}
	checkRAPL(Options{Config: cfg, Gap: time.Millisecond, RAPLReadFile: readFile}, r)
	return r
}

func copyFixture(t *testing.T, name string) string {
	t.Helper()
	dst := t.TempDir()
	if err := os.CopyFS(dst, os.DirFS(filepath.Join("../rapl/testdata", name))); err != nil {
		t.Fatal(err)
	}
	return dst
}

func TestRAPLTwoSocketsOK(t *testing.T) {
	root := copyFixture(t, "two-sockets")
	// what the .deb's tmpfiles rule makes of them
	for _, z := range []string{"intel-rapl:0", "intel-rapl:0:0", "intel-rapl:1", "intel-rapl:1:0"} {
		if err := os.Chmod(filepath.Join(root, "class/powercap", z, "energy_uj"), 0o440); err != nil {
			t.Fatal(err)
		}
	}
	r := raplReport(t, root, nil)
	want(t, r, SectionHostEnergy, "rapl", OK, "2 socket(s) read", "intel-rapl:0/package-0 0.0 W", "intel-rapl:1:0/dram")
	want(t, r, SectionHostEnergy, "dram", OK, "dram_energy_J is measured")
	if os.Geteuid() == 0 {
		want(t, r, SectionHostEnergy, "rapl access", OK)
	}
}

// As root the counters read, but the agent's service user could not: the
// doctor says so, with the fix.
func TestRAPLRootOnlyCountersWarnForTheServiceUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the root-only check runs as root")
	}
	root := copyFixture(t, "two-sockets")
	if err := os.Chmod(filepath.Join(root, "class/powercap/intel-rapl:1/energy_uj"), 0o400); err != nil {
		t.Fatal(err)
	}
	r := raplReport(t, root, nil)
	want(t, r, SectionHostEnergy, "rapl", OK)
	c := want(t, r, SectionHostEnergy, "rapl access", Warn, "1 counter(s) are root-only", "intel-rapl:1/energy_uj mode 0400")
	if !strings.Contains(c.Hint, "systemd-tmpfiles --create trainmeter-rapl.conf") {
		t.Errorf("hint %q", c.Hint)
	}
}

// energy_uj refused (injected, as root reads whatever the mode): FAIL
// with the exact fix.
func TestRAPLPermissionDeniedFails(t *testing.T) {
	r := raplReport(t, "../rapl/testdata/two-sockets", func(name string) ([]byte, error) {
		if filepath.Base(name) == "energy_uj" {
			return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrPermission}
		}
		return os.ReadFile(name)
	})
	c := want(t, r, SectionHostEnergy, "rapl", Fail, "not readable by", "(permission denied)")
	for _, s := range []string{"CVE-2020-8694", "sudo systemd-tmpfiles --create trainmeter-rapl.conf", "sudo chgrp trainmeter /sys/class/powercap/intel-rapl:*/energy_uj", "chmod 0440"} {
		if !strings.Contains(c.Hint, s) {
			t.Errorf("hint lacks %q: %s", s, c.Hint)
		}
	}
	if r.OK {
		t.Error("report OK with unreadable counters")
	}
}

func TestRAPLNoPowercapAndNoDRAMWarn(t *testing.T) {
	r := raplReport(t, "../rapl/testdata/no-powercap", nil)
	want(t, r, SectionHostEnergy, "rapl", Warn, "no RAPL counters under", "stay empty")
	if !r.OK {
		t.Error("no RAPL is a WARN, not a FAIL")
	}
	r = raplReport(t, copyFixture(t, "laptop-no-dram"), nil)
	want(t, r, SectionHostEnergy, "rapl", OK, "1 socket(s) read", "package-0")
	want(t, r, SectionHostEnergy, "dram", Warn, "no dram domain", "node_energy_J counts GPUs and CPU packages only")
}

func TestRAPLGarbledCounterFails(t *testing.T) {
	root := copyFixture(t, "two-sockets")
	if err := os.WriteFile(filepath.Join(root, "class/powercap/intel-rapl:0/energy_uj"), []byte("n/a\n"), 0o444); err != nil {
		t.Fatal(err)
	}
	want(t, raplReport(t, root, nil), SectionHostEnergy, "rapl", Fail, "not a counter")
}
