// Package deploy holds the deployment files (systemd units, examples); its
// test checks the systemd units with systemd-analyze verify.
package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

var units = []string{"trainmeter-agent.service", "trainmeter.service"}

// verify copies unit (its text, with edit applied) into a temp dir with
// ExecStart pointing at executables that exist there, runs
// `systemd-analyze verify` on it, and returns the diagnostics about the
// unit (every line that names it) and whether the command failed. A unit
// is good only with neither: systemd-analyze exits 0 on unknown keys and
// unparsable values, which it reports and ignores.
func verify(t *testing.T, sa, unit string, edit func(string) string) (diag []string, failed bool) {
	t.Helper()
	src, err := os.ReadFile(filepath.Join("systemd", unit))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin")
	if err := os.Mkdir(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, b := range []string{"trainmeter", "trainmeter-agent"} {
		if err := os.WriteFile(filepath.Join(bin, b), []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	text := strings.ReplaceAll(string(src), "/usr/bin/", bin+"/")
	if edit != nil {
		text = edit(text)
	}
	path := filepath.Join(dir, unit)
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(sa, "verify", "--man=no", path)
	cmd.Env = append(os.Environ(), "SYSTEMD_LOG_COLOR=0", "SYSTEMD_PAGER=")
	out, err := cmd.CombinedOutput()
	for _, l := range strings.Split(string(out), "\n") {
		if strings.Contains(l, unit) {
			diag = append(diag, l)
		}
	}
	return diag, err != nil
}

func systemdAnalyze(t *testing.T) string {
	sa, err := exec.LookPath("systemd-analyze")
	if err != nil {
		if os.Getenv("TRAINMETER_REQUIRE_SYSTEMD_ANALYZE") != "" {
			t.Fatal("systemd-analyze not found (.ci/run installs Debian's systemd package)")
		}
		t.Skip("systemd-analyze not found: apt-get install systemd")
	}
	return sa
}

func TestSystemdUnitsVerify(t *testing.T) {
	sa := systemdAnalyze(t)
	for _, u := range units {
		if diag, failed := verify(t, sa, u, nil); failed || len(diag) > 0 {
			t.Errorf("systemd-analyze verify %s: failed=%v\n%s", u, failed, strings.Join(diag, "\n"))
		}
	}
}

// The check must catch broken units: each mutation below is one that
// systemd would ignore or refuse at start.
func TestSystemdVerifyCatchesBrokenUnits(t *testing.T) {
	sa := systemdAnalyze(t)
	for name, edit := range map[string]func(string) string{
		"misspelt key":       func(s string) string { return strings.Replace(s, "ProtectSystem=strict", "ProtectSystm=strict", 1) },
		"bad value":          func(s string) string { return strings.Replace(s, "ProtectSystem=strict", "ProtectSystem=bogus", 1) },
		"bad restart policy": func(s string) string { return strings.Replace(s, "Restart=on-failure", "Restart=sometimes", 1) },
		"missing binary":     func(s string) string { return strings.Replace(s, "/bin/trainmeter", "/nonexistent/trainmeter", 1) },
		"bad device specifier": func(s string) string {
			return strings.Replace(s, "DevicePolicy=closed", "DevicePolicy=closed\nDeviceAllow=nvidia0 rw", 1)
		},
		"misspelt section":       func(s string) string { return strings.Replace(s, "[Service]", "[Servic]", 1) },
		"bad address family":     func(s string) string { return strings.Replace(s, "AF_INET6", "AF_IPV6", 1) },
		"bad syscall filter set": func(s string) string { return strings.Replace(s, "@system-service", "@system-servic", 1) },
	} {
		for _, u := range units {
			broken := edit
			diag, failed := verify(t, sa, u, func(s string) string {
				out := broken(s)
				if out == s {
					t.Fatalf("%s: the mutation did not change %s", name, u)
				}
				return out
			})
			if !failed && len(diag) == 0 {
				t.Errorf("%s in %s: systemd-analyze verify reported nothing", name, u)
			}
		}
	}
}

// The hardening the docs promise is in the units.
func TestSystemdUnitsAreHardened(t *testing.T) {
	common := []string{"User=trainmeter", "Group=trainmeter", "StateDirectory=trainmeter", "ProtectSystem=strict",
		"ProtectHome=yes", "NoNewPrivileges=yes", "PrivateTmp=yes", "CapabilityBoundingSet=\n", "DevicePolicy=closed",
		"RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6", "SystemCallArchitectures=native", "ProtectKernelTunables=yes",
		"Restart=on-failure"}
	want := map[string][]string{
		"trainmeter-agent.service": append(common, "RuntimeDirectory=trainmeter", "DeviceAllow=char-nvidia* rw",
			"DeviceAllow=/dev/nvidiactl rw", "DeviceAllow=/dev/nvidia-uvm rw", "Nice=-20\n",
			"ExecStart=/usr/bin/trainmeter-agent --config /etc/trainmeter/agent.yaml"),
		"trainmeter.service": append(common, "LimitNOFILE=65536", "PrivateDevices=yes",
			"ExecStart=/usr/bin/trainmeter serve --config /etc/trainmeter/collector.yaml\n"),
	}
	for u, keys := range want {
		b, err := os.ReadFile(filepath.Join("systemd", u))
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range keys {
			if !strings.Contains(string(b), k) {
				t.Errorf("%s lacks %q", u, strings.TrimSpace(k))
			}
		}
	}
}
