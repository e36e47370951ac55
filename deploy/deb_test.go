package deploy

import (
	"bufio"
	"bytes"
	"context"
	"debug/elf"
	"encoding/json"
	"fmt"
	"github.com/trainmeter/trainmeter/internal/testkit"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The files the .deb installs, as docs/deploy.md lists them, and their modes.
var debFiles = map[string]os.FileMode{
	"/usr/bin/trainmeter-agent":                        0o755,
	"/usr/bin/trainmeter":                              0o755,
	"/usr/lib/systemd/system/trainmeter-agent.service": 0o644,
	"/usr/lib/systemd/system/trainmeter.service":       0o644,
	"/usr/lib/sysusers.d/trainmeter.conf":              0o644,
	"/usr/lib/tmpfiles.d/trainmeter-rapl.conf":         0o644,
	"/etc/trainmeter/agent.yaml":                       0o644,
	"/etc/trainmeter/collector.yaml":                   0o644,
}

// debTestPrereqs skips (or, with TRAINMETER_REQUIRE_DEB_TEST set, as .ci/run
// does, fails) unless we are root with dpkg, chroot and ldd.
func debTestPrereqs(t *testing.T) {
	t.Helper()
	why := ""
	if os.Geteuid() != 0 {
		why = "not root (dpkg --root and chroot need root)"
	}
	for _, c := range []string{"dpkg", "dpkg-deb", "chroot", "ldd", "make"} {
		if _, err := exec.LookPath(c); err != nil && why == "" {
			why = c + " not found"
		}
	}
	if why == "" {
		return
	}
	if os.Getenv("TRAINMETER_REQUIRE_DEB_TEST") != "" {
		t.Fatalf("deb test: %s (TRAINMETER_REQUIRE_DEB_TEST is set)", why)
	}
	t.Skipf("deb test: %s; run as root on Debian, or set TRAINMETER_REQUIRE_DEB_TEST=1 to fail instead", why)
}

// buildDeb runs `make deb` into a temp dir and returns the package's path.
func buildDeb(t *testing.T) string {
	t.Helper()
	dist := t.TempDir()
	start := time.Now()
	cmd := exec.Command("make", "--no-print-directory", "-C", "..", "deb", "DIST="+dist, "VERSION=0.0.1+test")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make deb: %v\n%s", err, out)
	}
	t.Logf("make deb: %s", time.Since(start).Round(time.Millisecond))
	deb := filepath.Join(dist, "trainmeter_0.0.1+test_amd64.deb")
	if _, err := os.Stat(deb); err != nil {
		t.Fatal(err)
	}
	return deb
}

// newRoot makes a throwaway merged-/usr root with an empty dpkg database,
// /etc/passwd and friends with root only, /dev/null, and the host's copies
// of the executables the maintainer scripts and the test need, with their
// shared libraries (from ldd): no debootstrap, no network.
func newRoot(t *testing.T, tools ...string) string {
	t.Helper()
	root := t.TempDir()
	for _, d := range []string{"usr/bin", "usr/sbin", "usr/lib", "usr/lib64", "etc", "dev", "tmp", "run",
		"var/lib/dpkg/info", "var/lib/dpkg/updates", "var/lib/dpkg/triggers"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for l, target := range map[string]string{"bin": "usr/bin", "sbin": "usr/sbin", "lib": "usr/lib", "lib64": "usr/lib64"} {
		if err := os.Symlink(target, filepath.Join(root, l)); err != nil {
			t.Fatal(err)
		}
	}
	for name, text := range map[string]string{
		"var/lib/dpkg/status":    "",
		"var/lib/dpkg/available": "",
		"etc/passwd":             "root:x:0:0:root:/root:/bin/sh\n",
		"etc/group":              "root:x:0:\n",
		"etc/shadow":             "root:*::0:99999:7:::\n",
		"etc/gshadow":            "root:*::\n",
	} {
		if err := os.WriteFile(filepath.Join(root, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := syscall.Mknod(filepath.Join(root, "dev/null"), syscall.S_IFCHR|0o666, 1<<8|3); err != nil {
		t.Fatal(err)
	}
	copyFile(t, "/bin/dash", filepath.Join(root, "usr/bin/sh"), 0o755)
	for _, name := range append([]string{"getent", "nologin"}, tools...) {
		p, err := exec.LookPath(name)
		if err != nil {
			for _, d := range []string{"/usr/sbin", "/sbin"} {
				if _, e := os.Stat(filepath.Join(d, name)); e == nil {
					p, err = filepath.Join(d, name), nil
				}
			}
		}
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		real, err := filepath.EvalSymlinks(p)
		if err != nil {
			t.Fatal(err)
		}
		dst := filepath.Join(root, "usr/sbin", name)
		if strings.Contains(real, "/bin/") && !strings.Contains(real, "/sbin/") {
			dst = filepath.Join(root, "usr/bin", name)
		}
		copyFile(t, real, dst, 0o755)
		copyLibs(t, root, real)
	}
	return root
}

// copyLibs copies the shared libraries ldd names for exe into root at the
// same paths (resolved through the root's /lib -> usr/lib links).
func copyLibs(t *testing.T, root, exe string) {
	t.Helper()
	out, err := exec.Command("ldd", exe).Output()
	if err != nil {
		if strings.Contains(string(out), "not a dynamic executable") {
			return
		}
		t.Fatalf("ldd %s: %v", exe, err)
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		for _, f := range strings.Fields(sc.Text()) {
			if strings.HasPrefix(f, "/") {
				dst := filepath.Join(root, f)
				if _, err := os.Stat(dst); err == nil {
					continue
				}
				if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
					t.Fatal(err)
				}
				copyFile(t, f, dst, 0o755)
			}
		}
	}
}

func copyFile(t *testing.T, src, dst string, mode os.FileMode) {
	t.Helper()
	in, err := os.Open(src) // follows symlinks: the named path gets the content
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}

func dpkg(t *testing.T, root string, args ...string) string {
	t.Helper()
	cmd := exec.Command("dpkg", append([]string{"--root=" + root, "--force-not-root"}, args...)...)
	cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("dpkg %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// passwdEntry returns uid and gid of name in root's /etc/passwd.
func passwdEntry(t *testing.T, root, name string) (uid, gid int, line string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "etc/passwd"))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Split(l, ":")
		if len(f) == 7 && f[0] == name {
			uid, _ = strconv.Atoi(f[2])
			gid, _ = strconv.Atoi(f[3])
			return uid, gid, l
		}
	}
	t.Fatalf("no %s in %s/etc/passwd:\n%s", name, root, b)
	return 0, 0, ""
}

// groupID is group name's gid in root's /etc/group.
func groupID(t *testing.T, root, name string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "etc/group"))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Split(l, ":"); len(f) == 4 && f[0] == name {
			gid, _ := strconv.Atoi(f[2])
			return gid
		}
	}
	t.Fatalf("no group %s in %s/etc/group", name, root)
	return 0
}

// TestDebInstallsIntoThrowawayRoot builds the .deb, installs it with
// `dpkg --root` into two throwaway roots (the postinst creating the user
// with groupadd/useradd in one, systemd-sysusers in the other), checks
// every file lands where docs/deploy.md says, runs the installed collector,
// agent (simulated GPU) and CLI in the chroot as the trainmeter user until
// the collector has stored the agent's batches, then checks that a
// reinstall keeps an edited conffile and that remove and purge clean up.
func TestDebInstallsIntoThrowawayRoot(t *testing.T) {
	debTestPrereqs(t)
	deb := buildDeb(t)

	info, err := exec.Command("dpkg-deb", "--field", deb, "Package", "Architecture", "Depends").Output()
	if err != nil {
		t.Fatal(err)
	}
	if s := string(info); !strings.Contains(s, "Package: trainmeter") || !strings.Contains(s, "Architecture: amd64") || strings.Contains(s, "Depends:") {
		t.Errorf("control fields: %s", s)
	}

	variants := map[string][]string{"useradd": {"groupadd", "useradd"}}
	if _, err := exec.LookPath("systemd-sysusers"); err == nil {
		variants["sysusers"] = []string{"systemd-sysusers"}
	} else {
		t.Log("systemd-sysusers not on this host: only the useradd path of the postinst is tested")
	}
	for name, tools := range variants {
		t.Run(name, func(t *testing.T) {
			root := newRoot(t, tools...)
			out := dpkg(t, root, "-i", deb)
			t.Logf("dpkg -i:\n%s", out)
			checkInstalled(t, root)
			_, _, line := passwdEntry(t, root, "trainmeter")
			if !strings.HasSuffix(line, ":/var/lib/trainmeter:/usr/sbin/nologin") {
				t.Errorf("trainmeter user: %q", line)
			}
			if g, _ := os.ReadFile(filepath.Join(root, "etc/group")); !strings.Contains(string(g), "\ntrainmeter:x:") {
				t.Errorf("no trainmeter group:\n%s", g)
			}
			if name == "useradd" {
				runInstalled(t, root)
			}
			checkUpgradeAndRemove(t, root, deb)
		})
	}
}

func checkInstalled(t *testing.T, root string) {
	for p, mode := range debFiles {
		fi, err := os.Stat(filepath.Join(root, p))
		if err != nil {
			t.Errorf("%s: %v", p, err)
			continue
		}
		if fi.Mode().Perm() != mode {
			t.Errorf("%s: mode %v, want %v", p, fi.Mode().Perm(), mode)
		}
	}
	for _, b := range []string{"/usr/bin/trainmeter-agent", "/usr/bin/trainmeter"} {
		f, err := elf.Open(filepath.Join(root, b))
		if err != nil {
			t.Errorf("%s: not ELF: %v", b, err)
			continue
		}
		if f.Machine != elf.EM_X86_64 {
			t.Errorf("%s: machine %v", b, f.Machine)
		}
		f.Close()
	}
	conff, err := os.ReadFile(filepath.Join(root, "var/lib/dpkg/info/trainmeter.conffiles"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{"/etc/trainmeter/agent.yaml", "/etc/trainmeter/collector.yaml"} {
		if !strings.Contains(string(conff), c+"\n") {
			t.Errorf("%s is not a conffile:\n%s", c, conff)
		}
	}
	for u, want := range map[string]string{
		"trainmeter-agent.service": "ExecStart=/usr/bin/trainmeter-agent --config /etc/trainmeter/agent.yaml\n",
		"trainmeter.service":       "ExecStart=/usr/bin/trainmeter serve --config /etc/trainmeter/collector.yaml\n",
	} {
		b, _ := os.ReadFile(filepath.Join(root, "usr/lib/systemd/system", u))
		if !strings.Contains(string(b), want) {
			t.Errorf("%s lacks %q", u, want)
		}
	}
	// The installed tmpfiles rule, found by name as the unit's ExecStartPre
	// runs it, lets the installed group read the RAPL counters.
	if tf, err := exec.LookPath("systemd-tmpfiles"); err == nil {
		fakeSysfs(t, root)
		if out, err := exec.Command(tf, "--root="+root, "--create", "trainmeter-rapl.conf").CombinedOutput(); err != nil {
			t.Errorf("systemd-tmpfiles --create trainmeter-rapl.conf in the root: %v\n%s", err, out)
		}
		checkRAPLAccess(t, root, groupID(t, root, "trainmeter"))
	}
	// No systemd runs in the root: the postinst must not have enabled anything.
	if _, err := os.Stat(filepath.Join(root, "etc/systemd/system/multi-user.target.wants")); err == nil {
		t.Error("postinst enabled a unit without a running systemd")
	}
}

// chroot runs name inside root as uid:gid.
func chroot(ctx context.Context, root string, uid, gid int, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, "chroot", append([]string{fmt.Sprintf("--userspec=%d:%d", uid, gid), root, name}, args...)...)
	cmd.Env = []string{"PATH=/usr/bin:/usr/sbin", "HOME=/var/lib/trainmeter"}
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 10 * time.Second
	return cmd
}

// runInstalled runs the installed binaries in the root (they need only
// glibc, copied by ldd) as the trainmeter user, the agent from the installed
// /etc/trainmeter/agent.yaml: the collector must store the agent's batches.
func runInstalled(t *testing.T, root string) {
	uid, gid, _ := passwdEntry(t, root, "trainmeter")
	copyLibs(t, root, filepath.Join(root, "usr/bin/trainmeter-agent"))
	copyLibs(t, root, filepath.Join(root, "usr/bin/trainmeter"))
	// What the units' RuntimeDirectory= and StateDirectory= make under systemd.
	for _, d := range []string{"run/trainmeter", "var/lib/trainmeter"} {
		p := filepath.Join(root, d)
		if err := os.MkdirAll(p, 0o750); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(p, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	for _, b := range []string{"/usr/bin/trainmeter-agent", "/usr/bin/trainmeter"} {
		if out, err := chroot(ctx, root, uid, gid, b, "--help").CombinedOutput(); err != nil || !strings.Contains(string(out), "Usage:") {
			t.Fatalf("chroot %s --help: %v\n%s", b, err, out)
		}
	}

	grpcAddr, colStatus, agentStatus := testkit.FreeAddr(t), testkit.FreeAddr(t), testkit.FreeAddr(t)
	var colLog, agentLog bytes.Buffer
	// The installed collector.yaml passes --check there, and the collector
	// runs from it, as the unit runs it (flags: free ports).
	if out, err := chroot(ctx, root, uid, gid, "/usr/bin/trainmeter", "serve", "--config", "/etc/trainmeter/collector.yaml", "--check").CombinedOutput(); err != nil {
		t.Fatalf("serve --check of the installed collector.yaml: %v\n%s", err, out)
	}
	col := chroot(ctx, root, uid, gid, "/usr/bin/trainmeter", "serve", "--config", "/etc/trainmeter/collector.yaml",
		"--listen", grpcAddr, "--status-listen", colStatus)
	col.Stdout, col.Stderr = &colLog, &colLog
	if err := col.Start(); err != nil {
		t.Fatal(err)
	}
	agent := chroot(ctx, root, uid, gid, "/usr/bin/trainmeter-agent", "--config", "/etc/trainmeter/agent.yaml",
		"--gpu", "sim:1", "--collector", grpcAddr, "--status-listen", agentStatus, "--shutdown-timeout", "2s")
	agent.Stdout, agent.Stderr = &agentLog, &agentLog
	if err := agent.Start(); err != nil {
		t.Fatal(err)
	}
	stop := func() {
		for _, c := range []*exec.Cmd{agent, col} {
			if c.Process != nil {
				_ = c.Process.Signal(syscall.SIGTERM)
				_ = c.Wait()
			}
		}
	}
	defer stop()

	applied := 0.0
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline) && applied == 0; time.Sleep(200 * time.Millisecond) {
		resp, err := http.Get("http://" + colStatus + "/status")
		if err != nil {
			continue
		}
		var st struct {
			Ingest map[string]any `json:"ingest"`
		}
		_ = json.NewDecoder(resp.Body).Decode(&st)
		resp.Body.Close()
		applied, _ = st.Ingest["batches_applied"].(float64)
	}
	if applied == 0 {
		stop()
		t.Fatalf("the collector stored no batch from the agent in the root\ncollector:\n%s\nagent:\n%s", colLog.String(), agentLog.String())
	}
	t.Logf("collector stored %v batches from the installed agent", applied)
	if fi, err := os.Stat(filepath.Join(root, "run/trainmeter/agent.sock")); err != nil {
		t.Errorf("agent socket: %v", err)
	} else if st := fi.Sys().(*syscall.Stat_t); int(st.Gid) != gid || fi.Mode().Perm() != 0o660 {
		t.Errorf("agent socket: gid %d mode %v, want gid %d (trainmeter) and 0660", st.Gid, fi.Mode().Perm(), gid)
	}
	if out, err := chroot(ctx, root, 0, 0, "/usr/bin/trainmeter", "runs", "--collector", grpcAddr).CombinedOutput(); err != nil {
		t.Errorf("chroot trainmeter runs: %v\n%s", err, out)
	}
	// `trainmeter-agent doctor` (issue 7) must pass in the fresh root once it exists.
	if help, _ := chroot(ctx, root, 0, 0, "/usr/bin/trainmeter-agent", "--help").CombinedOutput(); !strings.Contains(string(help), "\n  doctor ") {
		t.Log("trainmeter-agent has no doctor subcommand yet: not run")
	} else if out, err := chroot(ctx, root, 0, 0, "/usr/bin/trainmeter-agent", "doctor", "--config", "/etc/trainmeter/agent.yaml",
		"--gpu", "sim:1", "--collector", grpcAddr).CombinedOutput(); err != nil {
		t.Errorf("chroot trainmeter-agent doctor --gpu sim:1: %v\n%s", err, out)
	} else {
		t.Logf("doctor in the root:\n%s", out)
	}
}

// checkUpgradeAndRemove: a reinstall keeps an edited conffile, remove keeps
// conffiles and drops the rest, purge drops the conffiles.
func checkUpgradeAndRemove(t *testing.T, root, deb string) {
	conf := filepath.Join(root, "etc/trainmeter/agent.yaml")
	b, err := os.ReadFile(conf)
	if err != nil {
		t.Fatal(err)
	}
	edited := strings.Replace(string(b), "collector: 127.0.0.1:7433", "collector: collector.example.com:7433", 1)
	if edited == string(b) {
		t.Fatal("agent.yaml has no `collector: 127.0.0.1:7433` line to edit")
	}
	if err := os.WriteFile(conf, []byte(edited), 0o644); err != nil {
		t.Fatal(err)
	}
	dpkg(t, root, "--force-confold", "-i", deb)
	if b, _ := os.ReadFile(conf); string(b) != edited {
		t.Error("reinstalling the .deb replaced an edited /etc/trainmeter/agent.yaml")
	}
	dpkg(t, root, "--remove", "trainmeter")
	if _, err := os.Stat(filepath.Join(root, "usr/bin/trainmeter-agent")); !os.IsNotExist(err) {
		t.Errorf("after remove, /usr/bin/trainmeter-agent: %v", err)
	}
	if _, err := os.Stat(conf); err != nil {
		t.Errorf("remove must keep the conffiles: %v", err)
	}
	dpkg(t, root, "--purge", "trainmeter")
	if _, err := os.Stat(conf); !os.IsNotExist(err) {
		t.Errorf("after purge, agent.yaml: %v", err)
	}
}
