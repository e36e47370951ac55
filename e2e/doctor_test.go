package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc"

	"github.com/trainmeter/trainmeter/internal/testkit"
	"github.com/trainmeter/trainmeter/pkg/tlsfiles"
	"github.com/trainmeter/trainmeter/pkg/tlsfiles/tlstest"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// doctorReport is the JSON of `trainmeter-agent doctor --json`.
type doctorReport struct {
	OK     bool `json:"ok"`
	Checks []struct {
		Section, Name, Status, Message, Hint string
	} `json:"checks"`
}

func (r doctorReport) check(t *testing.T, section, name string) (status, text string) {
	t.Helper()
	for _, c := range r.Checks {
		if c.Section == section && c.Name == name {
			return c.Status, c.Message + " hint: " + c.Hint
		}
	}
	t.Fatalf("no check %s/%s in %+v", section, name, r.Checks)
	return "", ""
}

// doctor runs the real binary and returns its stdout+stderr and exit code.
func doctor(t *testing.T, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(filepath.Join(binDir, "trainmeter-agent"), append([]string{"doctor", "--timeout", "3s"}, args...)...)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return string(out), 0
	case errors.As(err, &ee):
		return string(out), ee.ExitCode()
	}
	t.Fatalf("doctor %v: %v\n%s", args, err, out)
	return "", -1
}

// On a box without an NVIDIA driver (as the CI machines are), `doctor --gpu
// nvml` exits non-zero and says what is missing.
func TestDoctorWithoutDriverFailsClearly(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	out, code := doctor(t, "--gpu", "nvml", "--socket", filepath.Join(dir, "agent.sock"), "--spool", filepath.Join(dir, "spool"), "--collector", testkit.FreeAddr(t))
	if strings.Contains(out, "NVML loaded") {
		t.Skipf("this machine has an NVIDIA driver:\n%s", out)
	}
	if code == 0 {
		t.Fatalf("exit 0 without a driver:\n%s", out)
	}
	for _, want := range []string{
		"FAIL  nvml", "libnvidia-ml.so.1 not found", "is the NVIDIA driver installed", "--gpu sim:2",
		"trainmeter-agent: doctor: ", "checks failed",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

// Against a live collector and agent on simulated GPUs every check passes.
func TestDoctorOnALiveNodePasses(t *testing.T) {
	t.Parallel()
	c := startCollector(t)
	spoolDir := filepath.Join(t.TempDir(), "spool")
	sock := c.startAgent("doc-node", "sim:2", "--spool", spoolDir)
	c.waitStreaming("doc-node")

	// a node with RAPL, as agent/internal/rapl's fixture of a two-socket server
	rapl := "../agent/internal/rapl/testdata/two-sockets"
	out, code := doctor(t, "--gpu", "sim:2", "--socket", sock, "--collector", c.addr, "--node", "doc-node", "--spool", spoolDir, "--sysfs-root", rapl)
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	for _, want := range []string{
		"OK    backend", "simulated GPUs (sim:2", "OK    gpu 1 ", "a running agent (pid ", "answers SERVING",
		`accepts batches from node "doc-node" without a token`, "in use by a running agent (locked)", "checks OK.",
		"OK    rapl ", "2 socket(s) read: intel-rapl:0/package-0", "OK    dram ",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	t.Logf("doctor on a live node:\n%s", out)

	out, code = doctor(t, "--gpu", "sim:2", "--socket", sock, "--collector", c.addr, "--node", "doc-node", "--spool", spoolDir, "--sysfs-root", rapl, "--json")
	var rep doctorReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil || code != 0 || !rep.OK {
		t.Fatalf("--json: exit %d, %v:\n%s", code, err, out)
	}
}

// The ingest token check against the real collector with TLS and per-node
// tokens: the right token passes, a wrong one and another node's fail with
// the reason, and the probes leave no node behind at the collector.
func TestDoctorChecksTLSAndTheTokenAgainstTheRealCollector(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	f, err := tlstest.Write(dir)
	if err != nil {
		t.Fatal(err)
	}
	const nodeTok, otherTok = "e2e-doctor-node-token-41c9", "e2e-doctor-other-token-9d02"
	file := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	ingest := file("ingest-tokens.yaml", "doc-node: "+nodeTok+"\nother-node: "+otherTok+"\n")
	creds, err := tlsfiles.ClientCredentials(tlsfiles.ClientOptions{CAFile: f.CAFile}, nil)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := startSecureCollector(t, []grpc.DialOption{grpc.WithTransportCredentials(creds)},
		"--tls-cert", f.ServerCert, "--tls-key", f.ServerKey, "--ingest-tokens", ingest)

	run := func(token string, extra ...string) doctorReport {
		t.Helper()
		args := append([]string{"--gpu", "sim:1", "--json", "--collector", c.addr, "--node", "doc-node",
			"--socket", filepath.Join(dir, "none.sock"), "--spool", filepath.Join(dir, "spool"), "--tls-ca", f.CAFile}, extra...)
		if token != "" {
			args = append(args, "--token-file", file("token", token+"\n"))
		}
		out, code := doctor(t, args...)
		if strings.Contains(out, nodeTok) || strings.Contains(out, otherTok) {
			t.Errorf("the doctor printed a token:\n%s", out)
		}
		if code == 0 {
			t.Errorf("exit 0 without a socket:\n%s", out)
		}
		var rep doctorReport
		if err := json.Unmarshal([]byte(out[:strings.LastIndex(out, "}")+1]), &rep); err != nil {
			t.Fatalf("%v:\n%s", err, out)
		}
		return rep
	}
	expect := func(rep doctorReport, name, status string, substr ...string) {
		t.Helper()
		st, text := rep.check(t, "collector", name)
		if st != status {
			t.Errorf("%s: %s, want %s: %s", name, st, status, text)
		}
		for _, s := range substr {
			if !strings.Contains(text, s) {
				t.Errorf("%s: %q lacks %q", name, text, s)
			}
		}
	}

	rep := run(nodeTok)
	expect(rep, "tls", "OK", "TLS handshake OK", "trainmeter test CA")
	expect(rep, "health", "OK", "SERVING")
	expect(rep, "token", "OK", `accepts this token for node "doc-node"`)

	expect(run("e2e-doctor-wrong-token-0000"), "token", "FAIL", "refused the token", "invalid ingest token")
	expect(run(otherTok), "token", "FAIL", "belongs to another node", `belongs to node "other-node", not "doc-node"`)
	expect(run(""), "token", "FAIL", "needs an ingest token", "--token-file")

	other, err := tlstest.Write(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	expect(run(nodeTok, "--tls-ca", other.CAFile), "tls", "FAIL", "unknown authority", "--tls-ca is not the CA")

	// No probe registered a node or stored a hello.
	resp, err := c.q.ListNodes(context.Background(), &trainmeterv1.ListNodesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Nodes) != 0 {
		t.Errorf("the doctor's probes left nodes at the collector: %v", resp.Nodes)
	}
}
