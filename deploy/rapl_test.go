package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// raplZones are the counters' directories of a two-socket node, as the
// kernel lays them out (agent/internal/rapl/testdata), and one the rule must not
// touch: the MMIO interface's duplicate of the package.
var raplZones = []string{"intel-rapl:0", "intel-rapl:0:0", "intel-rapl:1", "intel-rapl:1:0", "intel-rapl-mmio:0"}

// fakeSysfs makes root/sys/class/powercap with each zone's energy_uj and
// name as the kernel makes them (root:root, 0400 and 0444).
func fakeSysfs(t *testing.T, root string) {
	t.Helper()
	for _, z := range raplZones {
		dir := filepath.Join(root, "sys/class/powercap", z)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for f, mode := range map[string]os.FileMode{"energy_uj": 0o400, "name": 0o444, "max_energy_range_uj": 0o400} {
			p := filepath.Join(dir, f)
			if err := os.WriteFile(p, []byte("1\n"), mode); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(p, mode); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// checkRAPLAccess says whether exactly the RAPL zones' energy_uj became
// readable by group gid, and nothing else changed.
func checkRAPLAccess(t *testing.T, root string, gid int) {
	t.Helper()
	for _, z := range raplZones {
		for f, want := range map[string]struct {
			mode os.FileMode
			gid  int
		}{"energy_uj": {0o440, gid}, "name": {0o444, 0}, "max_energy_range_uj": {0o400, 0}} {
			if z == "intel-rapl-mmio:0" {
				want.mode, want.gid = map[string]os.FileMode{"energy_uj": 0o400, "name": 0o444, "max_energy_range_uj": 0o400}[f], 0
			}
			p := filepath.Join(root, "sys/class/powercap", z, f)
			fi, err := os.Stat(p)
			if err != nil {
				t.Fatal(err)
			}
			st := fi.Sys().(*syscall.Stat_t)
			if fi.Mode().Perm() != want.mode || int(st.Gid) != want.gid || st.Uid != 0 {
				t.Errorf("%s/%s: mode %v uid %d gid %d, want %v root:%d", z, f, fi.Mode().Perm(), st.Uid, st.Gid, want.mode, want.gid)
			}
		}
	}
}

func tmpfilesPrereqs(t *testing.T) string {
	t.Helper()
	tf, err := exec.LookPath("systemd-tmpfiles")
	if err != nil {
		if os.Getenv("TRAINMETER_REQUIRE_SYSTEMD_ANALYZE") != "" {
			t.Fatal("systemd-tmpfiles not found (.ci/run installs Debian's systemd package)")
		}
		t.Skip("systemd-tmpfiles not found: apt-get install systemd")
	}
	if os.Geteuid() != 0 {
		t.Skip("changing a file's group to trainmeter needs root")
	}
	return tf
}

// The tmpfiles rule the .deb and `make install` ship gives group
// trainmeter read access to every RAPL energy counter and to nothing else
// (applied with --root to a fake tree, as systemd-tmpfiles would to /sys).
func TestRAPLTmpfilesRuleGrantsGroupReadOnly(t *testing.T) {
	tf := tmpfilesPrereqs(t)
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "etc/group"), []byte("root:x:0:\ntrainmeter:x:998:\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "etc/passwd"), []byte("root:x:0:0::/root:/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	fakeSysfs(t, root)
	conf, err := filepath.Abs("tmpfiles.d/trainmeter-rapl.conf")
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(tf, "--root="+root, "--create", conf).CombinedOutput(); err != nil {
		t.Fatalf("systemd-tmpfiles: %v\n%s", err, out)
	}
	checkRAPLAccess(t, root, 998)
}

// The agent's unit applies the rule as root before each start, and a node
// without RAPL still starts.
func TestAgentUnitAppliesRAPLRule(t *testing.T) {
	b, err := os.ReadFile("systemd/trainmeter-agent.service")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "\nExecStartPre=-+systemd-tmpfiles --create trainmeter-rapl.conf\n") {
		t.Error("trainmeter-agent.service does not apply trainmeter-rapl.conf before it starts")
	}
}
