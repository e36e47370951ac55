// Package tlstest makes throwaway certificate authorities and certificates
// for tests (ECDSA P-256), written as PEM files in a directory. Nothing here
// is for production; no private key is ever committed.
package tlstest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// CA is a test certificate authority.
type CA struct {
	Cert    *x509.Certificate
	Key     *ecdsa.PrivateKey
	CertPEM []byte
}

// NewCA makes a self-signed CA named name.
func NewCA(name string) (*CA, error) {
	der, key, err := sign(&x509.Certificate{
		Subject:               pkix.Name{CommonName: name},
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}, nil)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{Cert: cert, Key: key, CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}, nil
}

// sign makes a fresh key and a certificate from tmpl for it, valid from an
// hour ago for a day, under a random serial, signed by ca (nil: by itself).
func sign(tmpl *x509.Certificate, ca *CA) ([]byte, *ecdsa.PrivateKey, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl.SerialNumber, _ = rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Hour), time.Now().Add(24*time.Hour)
	parent, parentKey := tmpl, key
	if ca != nil {
		parent, parentKey = ca.Cert, ca.Key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	return der, key, err
}

// Leaf is a certificate and key in PEM.
type Leaf struct {
	CertPEM, KeyPEM []byte
	Serial          *big.Int
}

// Issue makes a certificate for cn, valid for the given DNS names and IPs
// (a server certificate when any are given), usable for both server and
// client authentication.
func (ca *CA) Issue(cn string, dnsNames []string, ips []net.IP) (*Leaf, error) {
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: cn},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		DNSNames:    dnsNames,
		IPAddresses: ips,
	}
	der, key, err := sign(tmpl, ca)
	if err != nil {
		return nil, err
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	return &Leaf{
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM:  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}),
		Serial:  tmpl.SerialNumber,
	}, nil
}

// WriteFile writes b to path (mode 0600) through a temporary file and a
// rename, as a certificate manager does, so a reader never sees half a file.
func WriteFile(path string, b []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".tmp-*")
	if err != nil {
		return err
	}
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return err
	}
	if err := tmp.Close(); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// Files is a set of PEM files for one TLS setup in a directory: a CA, a
// server certificate for localhost/127.0.0.1 and a client certificate.
type Files struct {
	Dir                        string
	CA                         *CA
	CAFile                     string
	ServerCert, ServerKey      string
	ClientCert, ClientKey      string
	ServerSerial, ClientSerial *big.Int
}

// Write makes a CA, a server and a client certificate under dir.
func Write(dir string) (*Files, error) {
	ca, err := NewCA("trainmeter test CA")
	if err != nil {
		return nil, err
	}
	f := &Files{Dir: dir, CA: ca, CAFile: filepath.Join(dir, "ca.pem"),
		ServerCert: filepath.Join(dir, "server.pem"), ServerKey: filepath.Join(dir, "server-key.pem"),
		ClientCert: filepath.Join(dir, "client.pem"), ClientKey: filepath.Join(dir, "client-key.pem")}
	if err := WriteFile(f.CAFile, ca.CertPEM); err != nil {
		return nil, err
	}
	if f.ServerSerial, err = f.IssueServer(ca); err != nil {
		return nil, err
	}
	if f.ClientSerial, err = writeLeaf(ca, "node-1", nil, nil, f.ClientCert, f.ClientKey); err != nil {
		return nil, err
	}
	return f, nil
}

// IssueServer (re)writes the server certificate and key, signed by ca, for
// localhost and 127.0.0.1, and returns its serial number.
func (f *Files) IssueServer(ca *CA) (*big.Int, error) {
	return writeLeaf(ca, "trainmeter collector", []string{"localhost", "collector.test"}, []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}, f.ServerCert, f.ServerKey)
}

// writeLeaf issues a certificate (Issue's arguments), writes its key, then
// itself, and returns its serial number.
func writeLeaf(ca *CA, cn string, dnsNames []string, ips []net.IP, certFile, keyFile string) (*big.Int, error) {
	l, err := ca.Issue(cn, dnsNames, ips)
	if err != nil {
		return nil, err
	}
	if err := WriteFile(keyFile, l.KeyPEM); err != nil {
		return nil, err
	}
	if err := WriteFile(certFile, l.CertPEM); err != nil {
		return nil, err
	}
	return l.Serial, nil
}
