package tlsfiles_test

import (
	"context"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"

	"github.com/trainmeter/trainmeter/pkg/tlsfiles"
	"github.com/trainmeter/trainmeter/pkg/tlsfiles/tlstest"
)

// serve runs a gRPC health server with creds on loopback.
func serve(t *testing.T, creds credentials.TransportCredentials) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(grpc.Creds(creds))
	healthpb.RegisterHealthServer(gs, health.NewServer())
	go gs.Serve(lis)
	t.Cleanup(gs.Stop)
	return lis.Addr().String()
}

// check makes a new connection (a new handshake) and one call; it returns
// the serial number of the server's certificate.
func check(t *testing.T, addr string, creds credentials.TransportCredentials) (*big.Int, error) {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var p peer.Peer
	_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Peer(&p), grpc.WaitForReady(false))
	if err != nil {
		return nil, err
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.PeerCertificates) == 0 {
		t.Fatalf("call succeeded without TLS: %T", p.AuthInfo)
	}
	return info.State.PeerCertificates[0].SerialNumber, nil
}

func mustFiles(t *testing.T) *tlstest.Files {
	t.Helper()
	f, err := tlstest.Write(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func serverCreds(t *testing.T, o tlsfiles.ServerOptions) credentials.TransportCredentials {
	t.Helper()
	c, err := tlsfiles.ServerCredentials(o, nil)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func clientCreds(t *testing.T, o tlsfiles.ClientOptions) credentials.TransportCredentials {
	t.Helper()
	c, err := tlsfiles.ClientCredentials(o, nil)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestTLSServerIsVerifiedWithTheCA(t *testing.T) {
	f := mustFiles(t)
	addr := serve(t, serverCreds(t, tlsfiles.ServerOptions{CertFile: f.ServerCert, KeyFile: f.ServerKey}))

	serial, err := check(t, addr, clientCreds(t, tlsfiles.ClientOptions{CAFile: f.CAFile}))
	if err != nil {
		t.Fatalf("client with the CA: %v", err)
	}
	if serial.Cmp(f.ServerSerial) != 0 {
		t.Errorf("server presented serial %v, want %v", serial, f.ServerSerial)
	}
	// The server name can be overridden (a certificate for another name).
	if _, err := check(t, addr, clientCreds(t, tlsfiles.ClientOptions{CAFile: f.CAFile, ServerName: "collector.test"})); err != nil {
		t.Errorf("--tls-server-name collector.test: %v", err)
	}
	if _, err := check(t, addr, clientCreds(t, tlsfiles.ClientOptions{CAFile: f.CAFile, ServerName: "other.test"})); err == nil {
		t.Error("a server name the certificate does not have was accepted")
	}
	other := mustFiles(t) // a different CA
	if _, err := check(t, addr, clientCreds(t, tlsfiles.ClientOptions{CAFile: other.CAFile})); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("client trusting another CA: err %v, want a certificate error", err)
	}
	if _, err := check(t, addr, insecure.NewCredentials()); err == nil {
		t.Error("a plaintext client got an answer from a TLS server")
	}
}

func TestMTLSRejectsClientsWithoutACertificateSignedByTheClientCA(t *testing.T) {
	f := mustFiles(t)
	addr := serve(t, serverCreds(t, tlsfiles.ServerOptions{CertFile: f.ServerCert, KeyFile: f.ServerKey, ClientCAFile: f.CAFile}))

	if _, err := check(t, addr, clientCreds(t, tlsfiles.ClientOptions{CAFile: f.CAFile})); err == nil {
		t.Error("client without a certificate was accepted")
	}
	other := mustFiles(t)
	if _, err := check(t, addr, clientCreds(t, tlsfiles.ClientOptions{CAFile: f.CAFile, CertFile: other.ClientCert, KeyFile: other.ClientKey})); err == nil {
		t.Error("client certificate from another CA was accepted")
	}
	if _, err := check(t, addr, clientCreds(t, tlsfiles.ClientOptions{CAFile: f.CAFile, CertFile: f.ClientCert, KeyFile: f.ClientKey})); err != nil {
		t.Errorf("client with a good certificate: %v", err)
	}
}

func TestRotatedCertificatesAreUsedWithoutRestart(t *testing.T) {
	f := mustFiles(t)
	addr := serve(t, serverCreds(t, tlsfiles.ServerOptions{CertFile: f.ServerCert, KeyFile: f.ServerKey, ClientCAFile: f.CAFile}))
	client := clientCreds(t, tlsfiles.ClientOptions{CAFile: f.CAFile, CertFile: f.ClientCert, KeyFile: f.ClientKey})
	first, err := check(t, addr, client)
	if err != nil {
		t.Fatal(err)
	}

	// 1. A new server certificate from the same CA.
	second, err := f.IssueServer(f.CA)
	if err != nil {
		t.Fatal(err)
	}
	got, err := check(t, addr, client)
	if err != nil {
		t.Fatal(err)
	}
	if got.Cmp(second) != 0 || got.Cmp(first) == 0 {
		t.Fatalf("after rotation the server presented %v, want the new %v (old %v)", got, second, first)
	}

	// 2. A whole new CA: the server's cert and client CA, and the client's
	// CA bundle and certificate, all rotated on disk; the same credentials
	// objects (no restart on either side) use them from the next handshake.
	ca2, err := tlstest.NewCA("second CA")
	if err != nil {
		t.Fatal(err)
	}
	third, err := f.IssueServer(ca2)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := check(t, addr, client); err == nil {
		t.Fatal("client still trusting the old CA accepted a certificate from the new one")
	}
	cl, err := ca2.Issue("node-1", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	bundle := append(append([]byte{}, ca2.CertPEM...), f.CA.CertPEM...)
	for path, b := range map[string][]byte{f.CAFile: bundle, f.ClientKey: cl.KeyPEM, f.ClientCert: cl.CertPEM} {
		if err := tlstest.WriteFile(path, b); err != nil {
			t.Fatal(err)
		}
	}
	got, err = check(t, addr, client)
	if err != nil {
		t.Fatalf("after rotating to a new CA: %v", err)
	}
	if got.Cmp(third) != 0 {
		t.Errorf("server presented %v, want %v", got, third)
	}

	// 3. A half-done rotation (a certificate whose key is not there yet)
	// keeps the last good pair in use.
	l4, err := ca2.Issue("collector", []string{"localhost"}, []net.IP{net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	if err := tlstest.WriteFile(f.ServerCert, l4.CertPEM); err != nil {
		t.Fatal(err)
	}
	got, err = check(t, addr, client)
	if err != nil {
		t.Fatalf("during a half-done rotation: %v", err)
	}
	if got.Cmp(third) != 0 {
		t.Errorf("during a half-done rotation the server presented %v, want the last good %v", got, third)
	}
	if err := tlstest.WriteFile(f.ServerKey, l4.KeyPEM); err != nil {
		t.Fatal(err)
	}
	if got, err = check(t, addr, client); err != nil || got.Cmp(l4.Serial) != 0 {
		t.Errorf("after the key arrived: serial %v err %v, want %v", got, err, l4.Serial)
	}
}

func TestBadFilesFailAtStart(t *testing.T) {
	f := mustFiles(t)
	missing := filepath.Join(t.TempDir(), "nope.pem")
	if _, err := tlsfiles.ServerCredentials(tlsfiles.ServerOptions{CertFile: f.ServerCert, KeyFile: missing}, nil); err == nil {
		t.Error("missing key accepted")
	}
	if _, err := tlsfiles.ServerCredentials(tlsfiles.ServerOptions{CertFile: f.ServerCert, KeyFile: f.ServerKey, ClientCAFile: f.ServerKey}, nil); err == nil {
		t.Error("a key as a CA bundle accepted")
	}
	if _, err := tlsfiles.ServerCredentials(tlsfiles.ServerOptions{CertFile: f.ServerCert}, nil); err == nil {
		t.Error("certificate without key accepted")
	}
	if _, err := tlsfiles.ServerCredentials(tlsfiles.ServerOptions{ClientCAFile: f.CAFile}, nil); err == nil {
		t.Error("client CA without a server certificate accepted")
	}
	if _, err := tlsfiles.ClientCredentials(tlsfiles.ClientOptions{CAFile: missing}, nil); err == nil {
		t.Error("missing CA accepted")
	}
	if _, err := tlsfiles.ClientCredentials(tlsfiles.ClientOptions{CertFile: f.ClientCert}, nil); err == nil {
		t.Error("client certificate without key accepted")
	}
}

func TestTokenFileIsReloadedAndNeedsTLSUnlessAllowed(t *testing.T) {
	path := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(path, []byte("  first-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := tlsfiles.TokenFromFile(path, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	md, _ := c.GetRequestMetadata(context.Background())
	if md["authorization"] != "Bearer first-token" {
		t.Errorf("metadata %q", md["authorization"])
	}
	if !c.RequireTransportSecurity() {
		t.Error("token credentials do not require TLS")
	}
	if err := tlstest.WriteFile(path, []byte("second-token\n")); err != nil {
		t.Fatal(err)
	}
	md, _ = c.GetRequestMetadata(context.Background())
	if md["authorization"] != "Bearer second-token" {
		t.Errorf("after rotation: metadata %q", md["authorization"])
	}
	// An emptied file keeps the last token.
	if err := tlstest.WriteFile(path, nil); err != nil {
		t.Fatal(err)
	}
	md, _ = c.GetRequestMetadata(context.Background())
	if md["authorization"] != "Bearer second-token" {
		t.Errorf("after emptying the file: metadata %q", md["authorization"])
	}
	if _, err := tlsfiles.TokenFromFile(path, false, nil); err == nil || strings.Contains(err.Error(), "second-token") {
		t.Errorf("empty token file at start: %v", err)
	}
	if c, _ := tlsfiles.StaticToken("x", true); c.RequireTransportSecurity() {
		t.Error("allowed plaintext token still requires TLS")
	}

	// gRPC itself refuses to send a TLS-only token over plaintext.
	addr := serve(t, insecure.NewCredentials())
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithPerRPCCredentials(c))
	if err == nil {
		defer conn.Close()
		_, err = healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{})
	}
	if err == nil || !strings.Contains(err.Error(), "transport level security") {
		t.Errorf("a token that requires TLS over plaintext: err %v, want a refusal", err)
	}
}

func TestIsLoopback(t *testing.T) {
	for addr, want := range map[string]bool{
		"127.0.0.1:7433": true, "localhost:1": true, "[::1]:7433": true, "127.1.2.3:9": true,
		"10.0.0.1:7433": false, "collector:7433": false, "0.0.0.0:7433": false, "[::]:1": false,
	} {
		if got := tlsfiles.IsLoopback(addr); got != want {
			t.Errorf("IsLoopback(%q) = %v, want %v", addr, got, want)
		}
	}
}
