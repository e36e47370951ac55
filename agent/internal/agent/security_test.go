package agent

import (
	"bytes"
	"context"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/trainmeter/trainmeter/agent/internal/agentconfig"
	"github.com/trainmeter/trainmeter/agent/internal/gpu/simgpu"
	"github.com/trainmeter/trainmeter/pkg/clock"
	"github.com/trainmeter/trainmeter/pkg/tlsfiles"
	"github.com/trainmeter/trainmeter/pkg/tlsfiles/tlstest"
)

type lockedBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// The agent sends its node token over mTLS, picks up a rotated token file
// without a restart, and never writes the token to its log.
func TestAgentSendsTokenOverMTLSAndNeverLogsIt(t *testing.T) {
	const oldTok, goodTok = "stale-agent-token-4242", "good-agent-token-9f9f"
	dir := t.TempDir()
	files, err := tlstest.Write(dir)
	if err != nil {
		t.Fatal(err)
	}
	tokFile := filepath.Join(dir, "token")
	if err := tlstest.WriteFile(tokFile, []byte(oldTok+"\n")); err != nil {
		t.Fatal(err)
	}

	// A fake collector: mTLS, and the right token or Unauthenticated.
	var mu sync.Mutex
	var refused int
	var clientCN string
	creds, err := tlsfiles.ServerCredentials(tlsfiles.ServerOptions{CertFile: files.ServerCert, KeyFile: files.ServerKey, ClientCAFile: files.CAFile}, nil)
	if err != nil {
		t.Fatal(err)
	}
	check := func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		md, _ := metadata.FromIncomingContext(ss.Context())
		if got := md.Get("authorization"); len(got) != 1 || got[0] != "Bearer "+goodTok {
			mu.Lock()
			refused++
			mu.Unlock()
			return status.Error(codes.Unauthenticated, "invalid ingest token")
		}
		if p, ok := peer.FromContext(ss.Context()); ok {
			if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok && len(ti.State.PeerCertificates) > 0 {
				mu.Lock()
				clientCN = ti.State.PeerCertificates[0].Subject.CommonName
				mu.Unlock()
			}
		}
		return h(srv, ss)
	}
	_, collectorAddr := startRecorder(t, grpc.Creds(creds), grpc.StreamInterceptor(check))

	logs := &lockedBuf{}
	logger := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	fake := clock.NewFake(time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC))
	cfg := DefaultConfig()
	cfg.Collector = "localhost:" + strings.Split(collectorAddr, ":")[1]
	cfg.Socket = filepath.Join(t.TempDir(), "agent.sock")
	cfg.Spool = filepath.Join(t.TempDir(), "spool")
	cfg.Node = "node-1"
	cfg.GPU = "sim:1"
	cfg.TLSCA, cfg.TLSCert, cfg.TLSKey = files.CAFile, files.ClientCert, files.ClientKey
	cfg.TokenFile = tokFile
	cfg.AllowedUIDs = []uint32{4242} // the test runs as some uid; root is always allowed
	a, err := New(cfg, simgpu.New(1, 1), fake, nil, logger)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		mu.Lock()
		n := refused
		mu.Unlock()
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the stale token was never refused")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Rotate the token on disk: the next reconnect uses it.
	if err := tlstest.WriteFile(tokFile, []byte(goodTok+"\n")); err != nil {
		t.Fatal(err)
	}

	tr := dialTrainer(t, cfg.Socket)
	fake.Advance(time.Second)
	if cfgAllows(cfg, 0) { // root always is
		tr.send(`{"event":"run_start","run_id":"sec","warmup_s":0}`)
		tr.sync()
		for i := 1; i <= 5; i++ {
			fake.Advance(100 * time.Millisecond)
			tr.send(`{"event":"step","run_id":"sec","step":` + itoa(i) + `,"tokens":100}`)
			tr.sync()
		}
		tr.send(`{"event":"run_end","run_id":"sec"}`)
		tr.sync()
	}
	fake.Advance(3 * time.Second)
	fake.Advance(50 * time.Millisecond)
	fctx, fcancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer fcancel()
	if err := a.up.Flush(fctx); err != nil {
		t.Fatalf("batches not acked after the token rotation: %v %+v\n%s", err, a.Status().Uplink, logs.String())
	}
	tr.conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := a.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	cn := clientCN
	mu.Unlock()
	if cn != "node-1" {
		t.Errorf("collector saw client certificate %q, want node-1 (mTLS)", cn)
	}
	out := logs.String()
	if !strings.Contains(out, "reconnecting") {
		t.Errorf("the refusal was not logged; log:\n%s", out)
	}
	for _, s := range []string{oldTok, goodTok} {
		if strings.Contains(out, s) {
			t.Errorf("the agent's log contains the token %q:\n%s", s, out)
		}
	}
}

// cfgAllows mirrors the socket's allow-list for a uid (root always).
func cfgAllows(cfg agentconfig.Config, uid uint32) bool {
	l := allowedUIDs(cfg)
	if l == nil {
		return true
	}
	for _, u := range l {
		if u == uid {
			return true
		}
	}
	return false
}

func TestTokenNeedsTLSToAnotherMachine(t *testing.T) {
	c := DefaultConfig()
	c.Collector = "collector.example:7433"
	c.TokenFile = "/etc/trainmeter/token"
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "only sent over TLS") {
		t.Errorf("token over plaintext to another machine: %v", err)
	}
	c.TLSCA = "/etc/trainmeter/ca.pem"
	if err := c.Validate(); err != nil {
		t.Errorf("token over TLS: %v", err)
	}
	c.TLSCA, c.Collector = "", "127.0.0.1:7433"
	if err := c.Validate(); err != nil {
		t.Errorf("token over plaintext to loopback: %v", err)
	}
	c.TLSCert = "/etc/trainmeter/client.pem"
	if err := c.Validate(); err == nil {
		t.Error("client certificate without key accepted")
	}
}
