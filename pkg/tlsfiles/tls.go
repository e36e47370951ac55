package tlsfiles

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"

	"google.golang.org/grpc/credentials"
)

// MinVersion is the lowest TLS version either side accepts.
const MinVersion = tls.VersionTLS12

// ServerOptions names the collector's certificate files.
type ServerOptions struct {
	CertFile, KeyFile string // PEM server certificate (chain) and key; required
	// ClientCAFile, when set, is a PEM bundle of CAs that sign client
	// certificates; a client certificate is then required (mTLS).
	ClientCAFile string
}

// ClientOptions names a client's (CLI, agent) certificate files.
type ClientOptions struct {
	// CAFile is a PEM bundle of CAs that sign the server's certificate; empty
	// uses the system roots.
	CAFile string
	// CertFile and KeyFile are the client certificate for mTLS; both or neither.
	CertFile, KeyFile string
	// ServerName overrides the name checked in the server's certificate
	// (default: the host part of the address dialled).
	ServerName string
}

// Enabled reports whether any client TLS option is set (the CA file, a
// client certificate or a server name: each implies TLS).
func (o ClientOptions) Enabled() bool {
	return o.CAFile != "" || o.CertFile != "" || o.KeyFile != "" || o.ServerName != ""
}

// Validate checks that the options go together.
func (o ServerOptions) Validate() error {
	if (o.CertFile == "") != (o.KeyFile == "") {
		return errors.New("tls: the certificate and the key go together: set both or neither")
	}
	if o.ClientCAFile != "" && o.CertFile == "" {
		return errors.New("tls: a client CA (mTLS) needs a server certificate and key")
	}
	return nil
}

// Enabled reports whether the server serves TLS.
func (o ServerOptions) Enabled() bool { return o.CertFile != "" }

// Validate checks that the options go together.
func (o ClientOptions) Validate() error {
	if (o.CertFile == "") != (o.KeyFile == "") {
		return errors.New("tls: the client certificate and key go together: set both or neither")
	}
	return nil
}

func loadKeyPair(certFile, keyFile string) func() (*tls.Certificate, error) {
	return func() (*tls.Certificate, error) {
		c, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("tls: key pair %s, %s: %w", certFile, keyFile, err)
		}
		return &c, nil
	}
}

func loadPool(file string) func() (*x509.CertPool, error) {
	return func() (*x509.CertPool, error) {
		b, err := os.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("tls: CA bundle: %w", err)
		}
		p := x509.NewCertPool()
		if !p.AppendCertsFromPEM(b) {
			return nil, fmt.Errorf("tls: CA bundle %s has no PEM certificate", file)
		}
		return p, nil
	}
}

// ServerConfig returns a server tls.Config whose certificate and client CAs
// are re-read from their files when they change: every handshake picks up
// the files as they are then (GetConfigForClient), so rotating a certificate
// needs no restart. Connections already open keep their certificate.
func ServerConfig(o ServerOptions, log *slog.Logger) (*tls.Config, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if !o.Enabled() {
		return nil, errors.New("tls: no server certificate set")
	}
	cert, err := Watch("server certificate", []string{o.CertFile, o.KeyFile}, loadKeyPair(o.CertFile, o.KeyFile), log)
	if err != nil {
		return nil, err
	}
	var cas *Watched[*x509.CertPool]
	if o.ClientCAFile != "" {
		if cas, err = Watch("client CA bundle", []string{o.ClientCAFile}, loadPool(o.ClientCAFile), log); err != nil {
			return nil, err
		}
	}
	perConn := func(*tls.ClientHelloInfo) (*tls.Config, error) {
		c := &tls.Config{
			MinVersion:   MinVersion,
			Certificates: []tls.Certificate{*cert.Get()},
		}
		if cas != nil {
			c.ClientCAs = cas.Get()
			c.ClientAuth = tls.RequireAndVerifyClientCert
		}
		return c, nil
	}
	return &tls.Config{MinVersion: MinVersion, GetConfigForClient: perConn}, nil
}

// ServerCredentials is ServerConfig wrapped as gRPC transport credentials.
func ServerCredentials(o ServerOptions, log *slog.Logger) (credentials.TransportCredentials, error) {
	c, err := ServerConfig(o, log)
	if err != nil {
		return nil, err
	}
	return credentials.NewTLS(c), nil
}

// ClientCredentials returns gRPC transport credentials that verify the server
// against o.CAFile (or the system roots) and present o.CertFile when set;
// the files are re-read when they change, checked on every handshake (a
// reconnect after a rotation uses the new files).
func ClientCredentials(o ClientOptions, log *slog.Logger) (credentials.TransportCredentials, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	rc := &reloadingClient{serverName: o.ServerName}
	var err error
	if o.CAFile != "" {
		if rc.roots, err = Watch("server CA bundle", []string{o.CAFile}, loadPool(o.CAFile), log); err != nil {
			return nil, err
		}
	}
	if o.CertFile != "" {
		if rc.cert, err = Watch("client certificate", []string{o.CertFile, o.KeyFile}, loadKeyPair(o.CertFile, o.KeyFile), log); err != nil {
			return nil, err
		}
	}
	return rc, nil
}

// reloadingClient builds a fresh tls.Config from the watched files for each
// handshake and hands it to gRPC's own TLS credentials, so ALPN, server name
// and AuthInfo behave exactly as with credentials.NewTLS.
type reloadingClient struct {
	roots      *Watched[*x509.CertPool]
	cert       *Watched[*tls.Certificate]
	serverName string
}

func (c *reloadingClient) config() *tls.Config {
	cfg := &tls.Config{MinVersion: MinVersion, ServerName: c.serverName}
	if c.roots != nil {
		cfg.RootCAs = c.roots.Get()
	}
	if c.cert != nil {
		cert := c.cert
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return cert.Get(), nil
		}
	}
	return cfg
}

func (c *reloadingClient) ClientHandshake(ctx context.Context, authority string, raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return credentials.NewTLS(c.config()).ClientHandshake(ctx, authority, raw)
}

func (c *reloadingClient) ServerHandshake(net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return nil, nil, errors.New("tlsfiles: client credentials used on a server")
}

func (c *reloadingClient) Info() credentials.ProtocolInfo {
	// What credentials.NewTLS answers: grpc still takes the authority
	// from ServerName when it is set.
	//lint:ignore SA1019 the fields are deprecated but still read by grpc.
	return credentials.ProtocolInfo{SecurityProtocol: "tls", SecurityVersion: "1.2", ServerName: c.serverName}
}

func (c *reloadingClient) Clone() credentials.TransportCredentials {
	cp := *c
	return &cp
}

func (c *reloadingClient) OverrideServerName(name string) error {
	c.serverName = name
	return nil
}
