//go:build linux

package harness

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TLSFiles are the PEM files of a test certificate authority and of one
// certificate it signed (for a server, or a client).
type TLSFiles struct {
	CA, Cert, Key string
}

// TestCA is a certificate authority made for one test: its key lives in
// memory, its certificate and the ones it signs are written under a
// temporary directory.
type TestCA struct {
	t    testing.TB
	dir  string
	key  *ecdsa.PrivateKey
	cert *x509.Certificate
	// CAFile is the authority's certificate, PEM.
	CAFile string

	serial atomic.Int64
	mu     sync.Mutex
	client *tls.Certificate // ClientConfig's
}

// NewTestCA makes a certificate authority valid for a day.
func NewTestCA(t testing.TB) *TestCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatalf("harness: CA key: %v", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "lockproxy test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatalf("harness: CA certificate: %v", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatalf("harness: CA certificate: %v", err)
	}
	ca := &TestCA{t: t, dir: t.TempDir(), key: key, cert: cert}
	ca.serial.Store(1)
	ca.CAFile = ca.write("ca.pem", "CERTIFICATE", der)
	return ca
}

// Server signs a server certificate for 127.0.0.1 and localhost.
func (ca *TestCA) Server() TLSFiles {
	return ca.issue("server", x509.ExtKeyUsageServerAuth, []net.IP{net.ParseIP("127.0.0.1")}, []string{"localhost"})
}

// Client signs a client certificate.
func (ca *TestCA) Client() TLSFiles {
	return ca.issue("client", x509.ExtKeyUsageClientAuth, nil, nil)
}

func (ca *TestCA) issue(name string, usage x509.ExtKeyUsage, ips []net.IP, dns []string) TLSFiles {
	t := ca.t
	t.Helper()
	serial := ca.serial.Add(1)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatalf("harness: %s key: %v", name, err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial),
		Subject:      pkix.Name{CommonName: "lockproxy test " + name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
		IPAddresses:  ips,
		DNSNames:     dns,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatalf("harness: %s certificate: %v", name, err)
	}
	kd, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatalf("harness: %s key: %v", name, err)
	}
	base := name + strconv.FormatInt(serial, 10)
	return TLSFiles{
		CA:   ca.CAFile,
		Cert: ca.write(base+".pem", "CERTIFICATE", der),
		Key:  ca.write(base+"-key.pem", "EC PRIVATE KEY", kd),
	}
}

func (ca *TestCA) write(name, kind string, der []byte) string {
	p := filepath.Join(ca.dir, name)
	if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
		ca.t.Fatalf("harness: write %s: %v", p, err)
	}
	return p
}

// ClientConfig is a TLS client configuration that trusts only ca and
// shows a client certificate it signed (for servers that require one).
func (ca *TestCA) ClientConfig() *tls.Config {
	ca.mu.Lock()
	defer ca.mu.Unlock()
	if ca.client == nil {
		f := ca.Client()
		cert, err := tls.LoadX509KeyPair(f.Cert, f.Key)
		if err != nil {
			ca.t.Fatalf("harness: client certificate: %v", err)
		}
		ca.client = &cert
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.cert)
	return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{*ca.client}}
}

// Install copies f's certificate and key to cert and key, as a renewal
// would leave them where a server reads them.
func (f TLSFiles) Install(t testing.TB, cert, key string) {
	t.Helper()
	for dst, src := range map[string]string{cert: f.Cert, key: f.Key} {
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatalf("harness: %v", err)
		}
		if err := os.WriteFile(dst, b, 0o600); err != nil {
			t.Fatalf("harness: %v", err)
		}
	}
}
