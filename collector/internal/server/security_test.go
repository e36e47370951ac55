package server_test

import (
	"context"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/trainmeter/trainmeter/collector/internal/server"
	tu "github.com/trainmeter/trainmeter/collector/internal/testutil"
	"github.com/trainmeter/trainmeter/internal/testkit"
	"github.com/trainmeter/trainmeter/pkg/tlsfiles"
	"github.com/trainmeter/trainmeter/pkg/tlsfiles/tlstest"
	trainmeterv1 "github.com/trainmeter/trainmeter/proto/trainmeter/v1"
)

// Distinct, greppable secrets: the log must never contain any of them.
const (
	tokNode1 = "node1-secret-7f3a9c"
	tokNode2 = "node2-secret-b81d44"
	tokRead  = "read-secret-55e0aa"
	tokAdmin = "admin-secret-c0ffee"
	tokWrong = "wrong-secret-123456"
	tokNew   = "node1-rotated-secret-9911"
)

var allSecrets = []string{tokNode1, tokNode2, tokRead, tokAdmin, tokWrong, tokNew}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := tlstest.WriteFile(path, []byte(content)); err != nil {
		t.Fatal(err)
	}
}

// secured starts a collector with mTLS and all three kinds of token, logging
// at debug level into the returned buffer.
func secured(t *testing.T) (srv *server.Server, files *tlstest.Files, dir string, log *testkit.Buffer) {
	t.Helper()
	dir = t.TempDir()
	files, err := tlstest.Write(dir)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, "ingest.yaml"), "node-1: "+tokNode1+"\nnode-2: "+tokNode2+"\n")
	writeFile(t, filepath.Join(dir, "read"), tokRead+"\n")
	writeFile(t, filepath.Join(dir, "admin"), tokAdmin+"\n")
	log = &testkit.Buffer{}
	cfg := server.Config{
		Listen: "127.0.0.1:0", DataDir: filepath.Join(dir, "data"), Clock: tu.Clock(),
		TLSCertFile: files.ServerCert, TLSKeyFile: files.ServerKey, TLSClientCAFile: files.CAFile,
		IngestTokensFile: filepath.Join(dir, "ingest.yaml"),
		ReadTokenFile:    filepath.Join(dir, "read"),
		AdminTokenFile:   filepath.Join(dir, "admin"),
	}
	srv = server.New(cfg, slog.New(slog.NewTextHandler(log, &slog.HandlerOptions{Level: slog.LevelDebug})))
	if err := srv.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			t.Error(err)
		}
		for _, s := range allSecrets {
			if strings.Contains(log.String(), s) {
				t.Errorf("the collector's log contains the secret %q:\n%s", s, log.String())
			}
		}
	})
	return srv, files, dir, log
}

// dialMTLS connects with the test client certificate.
func dialMTLS(t *testing.T, addr string, f *tlstest.Files) *grpc.ClientConn {
	t.Helper()
	creds, err := tlsfiles.ClientCredentials(tlsfiles.ClientOptions{CAFile: f.CAFile, CertFile: f.ClientCert, KeyFile: f.ClientKey}, nil)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func withToken(ctx context.Context, tok string) context.Context {
	if tok == "" {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+tok)
}

// hello opens an ingest stream with tok, sends a Hello for node and one
// batch, and returns the code the stream ends with (OK when acked).
func hello(t *testing.T, conn *grpc.ClientConn, tok, node string, seq uint64) codes.Code {
	t.Helper()
	ctx, cancel := context.WithTimeout(withToken(t.Context(), tok), 10*time.Second)
	defer cancel()
	s, err := trainmeterv1.NewIngestServiceClient(conn).Stream(ctx)
	if err != nil {
		return status.Code(err)
	}
	defer s.CloseSend()
	_ = s.Send(&trainmeterv1.StreamRequest{Msg: &trainmeterv1.StreamRequest_Hello{Hello: &trainmeterv1.Hello{Node: node, BootId: "boot", GpuBackend: "sim"}}})
	_ = s.Send(&trainmeterv1.StreamRequest{Msg: &trainmeterv1.StreamRequest_Batch{Batch: tu.Batch(seq, float64(seq),
		[]*trainmeterv1.RunWindow{tu.Window("run-"+node, float64(seq), 100, 10)}, tu.Start("run-"+node, float64(seq), "m"))}})
	resp, err := s.Recv()
	if err != nil {
		return status.Code(err)
	}
	if resp.GetAck() == nil {
		t.Fatalf("node %s: response %v, want an ack", node, resp)
	}
	return codes.OK
}

func TestIngestTokens(t *testing.T) {
	srv, files, dir, _ := secured(t)
	conn := dialMTLS(t, srv.Addr().String(), files)

	for _, c := range []struct {
		name, tok, node string
		want            codes.Code
	}{
		{"no token", "", "node-1", codes.Unauthenticated},
		{"wrong token", tokWrong, "node-1", codes.Unauthenticated},
		{"the read token", tokRead, "node-1", codes.Unauthenticated},
		{"the admin token", tokAdmin, "node-1", codes.Unauthenticated},
		{"node-2's token for node-1", tokNode2, "node-1", codes.PermissionDenied},
		{"node-1's token for a node not in the file", tokNode1, "node-9", codes.PermissionDenied},
		{"node-1's own token", tokNode1, "node-1", codes.OK},
		{"node-2's own token", tokNode2, "node-2", codes.OK},
	} {
		if got := hello(t, conn, c.tok, c.node, 1); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}

	// Rotating the tokens file takes effect for new streams, no restart.
	writeFile(t, filepath.Join(dir, "ingest.yaml"), "node-1: "+tokNew+"\nnode-2: "+tokNode2+"\n")
	if got := hello(t, conn, tokNode1, "node-1", 2); got != codes.Unauthenticated {
		t.Errorf("old node-1 token after rotation: %v, want Unauthenticated", got)
	}
	if got := hello(t, conn, tokNew, "node-1", 3); got != codes.OK {
		t.Errorf("new node-1 token after rotation: %v, want OK", got)
	}
	// A broken edit keeps the last good tokens.
	writeFile(t, filepath.Join(dir, "ingest.yaml"), "node-1: [oops\n")
	if got := hello(t, conn, tokNew, "node-1", 4); got != codes.OK {
		t.Errorf("after a broken edit: %v, want the last good tokens in force", got)
	}
}

func TestQueryTokensReadAndAdmin(t *testing.T) {
	srv, files, _, _ := secured(t)
	conn := dialMTLS(t, srv.Addr().String(), files)
	q := trainmeterv1.NewQueryServiceClient(conn)
	if got := hello(t, conn, tokNode1, "node-1", 1); got != codes.OK {
		t.Fatalf("ingest: %v", got)
	}

	call := func(tok string, fn func(ctx context.Context) error) codes.Code {
		ctx, cancel := context.WithTimeout(withToken(t.Context(), tok), 10*time.Second)
		defer cancel()
		return status.Code(fn(ctx))
	}
	list := func(ctx context.Context) error {
		_, err := q.ListRuns(ctx, &trainmeterv1.ListRunsRequest{})
		return err
	}
	export := func(ctx context.Context) error {
		s, err := q.ExportRuns(ctx, &trainmeterv1.ExportRunsRequest{})
		if err != nil {
			return err
		}
		_, err = s.Recv()
		return err
	}
	del := func(ctx context.Context) error {
		// The run is live: Force, since this is about who may delete.
		_, err := q.DeleteRun(ctx, &trainmeterv1.DeleteRunRequest{RunId: "run-node-1", Force: true})
		return err
	}
	for _, c := range []struct {
		name string
		tok  string
		fn   func(context.Context) error
		want codes.Code
	}{
		{"ListRuns without a token", "", list, codes.Unauthenticated},
		{"ListRuns with a wrong token", tokWrong, list, codes.Unauthenticated},
		{"ListRuns with a node's ingest token", tokNode1, list, codes.Unauthenticated},
		{"ListRuns with the read token", tokRead, list, codes.OK},
		{"ListRuns with the admin token", tokAdmin, list, codes.OK},
		{"ExportRuns without a token", "", export, codes.Unauthenticated},
		{"ExportRuns with the read token", tokRead, export, codes.OK},
		{"DeleteRun without a token", "", del, codes.Unauthenticated},
		{"DeleteRun with the read token", tokRead, del, codes.PermissionDenied},
		{"DeleteRun with a node's token", tokNode1, del, codes.Unauthenticated},
		{"DeleteRun with the admin token", tokAdmin, del, codes.OK},
		{"DeleteRun again (gone)", tokAdmin, del, codes.NotFound},
	} {
		if got := call(c.tok, c.fn); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
	if got := call(tokRead, func(ctx context.Context) error {
		_, err := q.GetRun(ctx, &trainmeterv1.GetRunRequest{RunId: "run-node-1"})
		return err
	}); got != codes.NotFound {
		t.Errorf("GetRun of the deleted run: %v, want NotFound", got)
	}
	// Health stays open (load balancers, systemd probes carry no token).
	if _, err := healthpb.NewHealthClient(conn).Check(t.Context(), &healthpb.HealthCheckRequest{}); err != nil {
		t.Errorf("health without a token: %v", err)
	}
	// Bearer is case-insensitive, as RFC 6750 says.
	if _, err := q.ListNodes(metadata.AppendToOutgoingContext(t.Context(), "authorization", "bearer "+tokRead), &trainmeterv1.ListNodesRequest{}); err != nil {
		t.Errorf("lower-case bearer: %v", err)
	}
}

func TestOnlyReadTokenMeansAdminRPCsAreOff(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "read"), tokRead)
	srv := start(t, server.Config{ReadTokenFile: filepath.Join(dir, "read")})
	q := trainmeterv1.NewQueryServiceClient(tu.Dial(t, srv.Addr().String()))
	ctx := withToken(t.Context(), tokRead)
	if _, err := q.ListRuns(ctx, &trainmeterv1.ListRunsRequest{}); err != nil {
		t.Errorf("read token on loopback plaintext: %v", err)
	}
	if _, err := q.DeleteRun(ctx, &trainmeterv1.DeleteRunRequest{RunId: "x"}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("DeleteRun with no admin token configured: %v, want PermissionDenied", err)
	}
	// Ingest has no tokens here: it stays open.
	tu.Connect(t, tu.Dial(t, srv.Addr().String()), "n", "b").MustAck(tu.Batch(1, 0, []*trainmeterv1.RunWindow{tu.Window("r", 0, 1, 1)}, tu.Start("r", 0, "m")))
}

func TestTLSWithoutClientCAAcceptsAnyClientThatTrustsTheServer(t *testing.T) {
	files, err := tlstest.Write(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	srv := start(t, server.Config{TLSCertFile: files.ServerCert, TLSKeyFile: files.ServerKey})
	creds, err := tlsfiles.ClientCredentials(tlsfiles.ClientOptions{CAFile: files.CAFile}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]credentials.TransportCredentials{"tls": creds} {
		conn, err := grpc.NewClient(srv.Addr().String(), grpc.WithTransportCredentials(c))
		if err != nil {
			t.Fatal(err)
		}
		tu.Connect(t, conn, "n", "b").MustAck(tu.Batch(1, 0, []*trainmeterv1.RunWindow{tu.Window("r", 0, 1, 1)}, tu.Start("r", 0, "m")))
		if _, err := trainmeterv1.NewQueryServiceClient(conn).ListRuns(t.Context(), &trainmeterv1.ListRunsRequest{}); err != nil {
			t.Errorf("%s: %v", name, err)
		}
		conn.Close()
	}
	// A plaintext client gets nothing.
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	if _, err := trainmeterv1.NewQueryServiceClient(tu.Dial(t, srv.Addr().String())).ListRuns(ctx, &trainmeterv1.ListRunsRequest{}); err == nil {
		t.Error("plaintext client answered by a TLS collector")
	}
}

func TestBadSecurityFilesFailStart(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "dup.yaml"), "a: same\nb: same\n")
	writeFile(t, filepath.Join(dir, "list.yaml"), "- "+tokNode1+"\n")
	writeFile(t, filepath.Join(dir, "same"), tokRead)
	writeFile(t, filepath.Join(dir, "empty"), "\n")
	for name, cfg := range map[string]server.Config{
		"missing ingest tokens":       {IngestTokensFile: filepath.Join(dir, "nope.yaml")},
		"two nodes share a token":     {IngestTokensFile: filepath.Join(dir, "dup.yaml")},
		"ingest tokens not a map":     {IngestTokensFile: filepath.Join(dir, "list.yaml")},
		"read and admin are the same": {ReadTokenFile: filepath.Join(dir, "same"), AdminTokenFile: filepath.Join(dir, "same")},
		"empty admin token":           {AdminTokenFile: filepath.Join(dir, "empty")},
		"certificate without key":     {TLSCertFile: filepath.Join(dir, "same")},
	} {
		cfg.Listen, cfg.DataDir = "127.0.0.1:0", t.TempDir()
		srv := server.New(cfg, quiet())
		err := srv.Start(t.Context())
		if err == nil {
			_ = srv.Shutdown(context.Background())
			t.Errorf("%s: collector started", name)
			continue
		}
		if strings.Contains(err.Error(), tokNode1) || strings.Contains(err.Error(), tokRead) {
			t.Errorf("%s: error shows a secret: %v", name, err)
		}
	}
}

func TestPlaintextOnANonLoopbackAddressWarnsOnce(t *testing.T) {
	for _, c := range []struct {
		listen string
		warns  int
	}{{"127.0.0.1:0", 0}, {"0.0.0.0:0", 1}} {
		log := &testkit.Buffer{}
		srv := server.New(server.Config{Listen: c.listen, DataDir: t.TempDir()}, slog.New(slog.NewTextHandler(log, nil)))
		if err := srv.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		_ = srv.Shutdown(context.Background())
		if got := strings.Count(log.String(), "serving plaintext gRPC on a non-loopback address"); got != c.warns {
			t.Errorf("listen %s: %d warnings, want %d:\n%s", c.listen, got, c.warns, log.String())
		}
	}
}
