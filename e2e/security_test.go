package e2e

import (
	"context"
	"encoding/csv"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/trainmeter/trainmeter/internal/testkit"
	"github.com/trainmeter/trainmeter/pkg/tlsfiles"
	"github.com/trainmeter/trainmeter/pkg/tlsfiles/tlstest"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// startSecureCollector is startCollector for a collector with TLS flags: it
// dials with creds (and a token) instead of plaintext. It also returns the
// collector's log file.
func startSecureCollector(t *testing.T, dial []grpc.DialOption, extra ...string) (*cluster, string) {
	t.Helper()
	addr := testkit.FreeAddr(t)
	cmd := daemon(t, "trainmeter", append([]string{"serve", "--listen", addr, "--data", filepath.Join(t.TempDir(), "data")}, extra...)...)
	conn, err := grpc.NewClient(addr, dial...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	c := &cluster{t: t, addr: addr, q: trainmeterv1.NewQueryServiceClient(conn)}
	c.eventually("collector answering over mTLS", func() bool {
		_, err := c.q.ListRuns(context.Background(), &trainmeterv1.ListRunsRequest{})
		return err == nil
	})
	return c, cmd.Stdout.(*os.File).Name()
}

// The real binaries over mTLS with tokens: an agent with its node token
// reports a run, the CLI reads it with the read token, the read token cannot
// delete it, the admin token can, and no secret reaches either daemon's log.
func TestMTLSAndTokensEndToEnd(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	f, err := tlstest.Write(dir)
	if err != nil {
		t.Fatal(err)
	}
	const (
		nodeTok  = "e2e-node-token-5ad1c3"
		otherTok = "e2e-other-node-token-77aa"
		readTok  = "e2e-read-token-0b0e"
		adminTok = "e2e-admin-token-feed"
	)
	secrets := []string{nodeTok, otherTok, readTok, adminTok}
	file := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	ingest := file("ingest-tokens.yaml", "sec-node: "+nodeTok+"\nother-node: "+otherTok+"\n")
	readFile, adminFile := file("read.token", readTok+"\n"), file("admin.token", adminTok+"\n")
	agentTokFile := file("agent.token", nodeTok+"\n")

	creds, err := tlsfiles.ClientCredentials(tlsfiles.ClientOptions{CAFile: f.CAFile, CertFile: f.ClientCert, KeyFile: f.ClientKey}, nil)
	if err != nil {
		t.Fatal(err)
	}
	readCreds, _ := tlsfiles.StaticToken(readTok, false)
	c, collectorLog := startSecureCollector(t, []grpc.DialOption{grpc.WithTransportCredentials(creds), grpc.WithPerRPCCredentials(readCreds)},
		"--tls-cert", f.ServerCert, "--tls-key", f.ServerKey, "--tls-client-ca", f.CAFile,
		"--ingest-tokens", ingest, "--read-token-file", readFile, "--admin-token-file", adminFile, "--log-level", "debug")

	tlsArgs := []string{"--tls-ca", f.CAFile, "--tls-cert", f.ClientCert, "--tls-key", f.ClientKey, "--tls-server-name", "localhost"}
	// The allow-list names another uid: root is always allowed, so as root
	// the run still goes through; as another user, allow that user.
	allow := os.Getuid()
	if allow == 0 {
		allow = 4242
	}
	sock := c.startAgent("sec-node", "sim:1", append(tlsArgs, "--token-file", agentTokFile, "--allow-uid", fmt.Sprint(allow), "--log-level", "debug")...)

	// A run over the socket.
	tr := dialTrainer(t, sock)
	tr.send(`{"event":"run_start","run_id":"secure","model":"m","warmup_s":0}`)
	tr.runSteps("secure", 20, 1000, 20*time.Millisecond)
	tr.send(`{"event":"run_end","run_id":"secure"}`)
	tr.sync()
	c.waitEnded("secure")

	cli := func(env []string, args ...string) (string, error) {
		cmd := exec.Command(filepath.Join(binDir, "trainmeter"), append(args, append([]string{"--collector", c.addr}, tlsArgs...)...)...)
		cmd.Env = append(os.Environ(), env...)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	// CSV with the read token from $TRAINMETER_TOKEN.
	out := filepath.Join(t.TempDir(), "runs.csv")
	if o, err := cli([]string{"TRAINMETER_TOKEN=" + readTok}, "export", "csv", "--out", out, "--run", "secure"); err != nil {
		t.Fatalf("export with the read token: %v\n%s", err, o)
	}
	fh, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	rows, err := csv.NewReader(fh).ReadAll()
	fh.Close()
	if err != nil || len(rows) != 2 {
		t.Fatalf("csv: %v %v", rows, err)
	}
	row := map[string]string{}
	for i, h := range rows[0] {
		row[h] = rows[1][i]
	}
	if row["tokens_processed"] != "20000" {
		t.Errorf("tokens_processed %s, want 20000", row["tokens_processed"])
	}

	// No token: refused, and the message says how to give one.
	if o, err := cli([]string{"TRAINMETER_TOKEN="}, "runs"); err == nil || !strings.Contains(o, "Unauthenticated") && !strings.Contains(o, "token") {
		t.Errorf("runs without a token: err %v\n%s", err, o)
	}
	// No client certificate: the handshake fails (mTLS).
	cmd := exec.Command(filepath.Join(binDir, "trainmeter"), "runs", "--collector", c.addr, "--tls-ca", f.CAFile, "--token-file", readFile, "--timeout", "3s")
	if o, err := cmd.CombinedOutput(); err == nil {
		t.Errorf("runs without a client certificate succeeded:\n%s", o)
	}
	// The read token cannot delete; the admin token can.
	if o, err := cli(nil, "delete-run", "secure", "--token-file", readFile); err == nil || !strings.Contains(o, "admin") {
		t.Errorf("delete-run with the read token: err %v\n%s", err, o)
	}
	if o, err := cli(nil, "delete-run", "secure", "--token-file", adminFile); err != nil || !strings.Contains(o, "deleted run secure") {
		t.Errorf("delete-run with the admin token: err %v\n%s", err, o)
	}
	if o, err := cli(nil, "report", "secure", "--token-file", readFile); err == nil || !strings.Contains(o, "not found") {
		t.Errorf("report after delete: err %v\n%s", err, o)
	}

	// Secrets never logged: grep both daemons' logs (debug level) after all
	// of the above, refusals included.
	for _, logPath := range []string{collectorLog, agentLog(t, sock)} {
		b, err := os.ReadFile(logPath)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range secrets {
			if strings.Contains(string(b), s) {
				t.Errorf("%s contains the secret %q", filepath.Base(logPath), s)
			}
		}
		if want := map[bool]string{true: "request refused", false: "level=DEBUG"}[logPath == collectorLog]; !strings.Contains(string(b), want) {
			t.Errorf("%s has no %q line: the check would prove little", filepath.Base(logPath), want)
		}
	}
}

// agentLog finds the agent's log: daemon() writes it into a temp dir of the
// test; the agent's is the one naming the socket.
func agentLog(t *testing.T, sock string) string {
	t.Helper()
	matches, _ := filepath.Glob(filepath.Join(filepath.Dir(filepath.Dir(sock)), "*", "trainmeter-agent.log"))
	for _, m := range matches {
		if b, err := os.ReadFile(m); err == nil && strings.Contains(string(b), sock) {
			return m
		}
	}
	t.Fatalf("no agent log for %s among %v", sock, matches)
	return ""
}
