package conf

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/test/harness"
)

// testCA is a certificate authority made in memory for one test, with
// what the harness's TestCA cannot make: intermediates, expired
// certificates, certificates for other names or uses.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	der  []byte
	up   []*testCA // the chain above it, for an intermediate
}

var testSerial atomic.Int64

func newKey(t *testing.T) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// newTestCA is a root CA, or with parent an intermediate it signed.
func newTestCA(t *testing.T, name string, parent *testCA) *testCA {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(testSerial.Add(1)),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	signer, signerKey := tmpl, key
	var up []*testCA
	if parent != nil {
		signer, signerKey = parent.cert, parent.key
		up = append([]*testCA{parent}, parent.up...)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, signer, &key.PublicKey, signerKey)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &testCA{cert: cert, key: key, der: der, up: up}
}

// pemFile writes the CAs' certificates to one PEM file in dir.
func pemFile(t *testing.T, path string, cas ...*testCA) string {
	t.Helper()
	var b []byte
	for _, ca := range cas {
		b = append(b, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.der})...)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// leafSpec is what a certificate ca signs is made for.
type leafSpec struct {
	dns      []string
	ips      []net.IP
	usage    x509.ExtKeyUsage
	notAfter time.Time // zero: a day from now
	noChain  bool      // the holder does not send the intermediates
}

// leaf is a certificate ca signed, with the intermediates between it and
// the root unless spec.noChain.
func (ca *testCA) leaf(t *testing.T, spec leafSpec) tls.Certificate {
	t.Helper()
	key := newKey(t)
	notAfter := spec.notAfter
	if notAfter.IsZero() {
		notAfter = time.Now().Add(24 * time.Hour)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(testSerial.Add(1)),
		Subject:      pkix.Name{CommonName: "leaf"},
		NotBefore:    time.Now().Add(-2 * time.Hour),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{spec.usage},
		DNSNames:     spec.dns,
		IPAddresses:  spec.ips,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	c := tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
	if !spec.noChain && ca.up != nil {
		c.Certificate = append(c.Certificate, ca.der)
		for _, u := range ca.up[:len(ca.up)-1] { // not the root
			c.Certificate = append(c.Certificate, u.der)
		}
	}
	return c
}

var localhost = leafSpec{dns: []string{"localhost"}, ips: []net.IP{net.ParseIP("127.0.0.1")}, usage: x509.ExtKeyUsageServerAuth}

// handshake runs a TLS handshake over loopback TCP between client and
// server, and returns the client's error and the server's.
func handshake(t *testing.T, client, server *tls.Config) (clientErr, serverErr error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	done := make(chan error, 1)
	go func() {
		s, err := ln.Accept()
		if err != nil {
			done <- err
			return
		}
		ts := tls.Server(s, server)
		err = ts.HandshakeContext(ctx)
		_ = ts.Close() // close_notify: the verdict the client waits for
		done <- err
	}()
	c, err := net.DialTimeout("tcp", ln.Addr().String(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	tc := tls.Client(c, client)
	clientErr = tc.HandshakeContext(ctx)
	if clientErr == nil {
		// TLS 1.3: the client is done before the server has checked its
		// certificate; the server's verdict, an alert or its close,
		// comes after.
		_ = tc.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, _ = tc.Read(make([]byte, 1))
	}
	_ = c.Close()
	return clientErr, <-done
}

// TestCAReloader: Reload swaps in the CAs now in the file; a file that is
// gone or holds no PEM certificate leaves the pool in use.
func TestCAReloader(t *testing.T) {
	ca1, ca2 := newTestCA(t, "CA1", nil), newTestCA(t, "CA2", nil)
	file := pemFile(t, filepath.Join(t.TempDir(), "ca.pem"), ca1)
	r, err := NewCAReloader("ca_file", file)
	if err != nil {
		t.Fatal(err)
	}
	if again, err := NewCAReloader("client_ca_file", file); err != nil || again != r {
		t.Fatalf("NewCAReloader of the same file = %p, %v; want the same reloader %p", again, err, r)
	}
	if !slices.Contains(CAReloaders(), r) {
		t.Fatal("the reloader is not listed")
	}
	trusts := func(ca *testCA) bool {
		leaf, err := x509.ParseCertificate(ca.leaf(t, localhost).Certificate[0])
		if err != nil {
			t.Fatal(err)
		}
		_, err = leaf.Verify(x509.VerifyOptions{Roots: r.Pool(), DNSName: "localhost"})
		return err == nil
	}
	if !trusts(ca1) || trusts(ca2) {
		t.Fatalf("at start: trusts CA1 %v, CA2 %v; want CA1 only", trusts(ca1), trusts(ca2))
	}
	for _, tc := range []struct {
		name    string
		write   func()
		wantErr string
		ca1     bool // trusted after the reload
		ca2     bool
	}{
		{"the other CA", func() { pemFile(t, file, ca2) }, "", false, true},
		{"a bundle of both", func() { pemFile(t, file, ca1, ca2) }, "", true, true},
		{"no PEM certificate", func() {
			if err := os.WriteFile(file, []byte("not a certificate\n"), 0o600); err != nil {
				t.Fatal(err)
			}
		}, "no PEM certificate", true, true},
		{"file gone", func() {
			if err := os.Remove(file); err != nil {
				t.Fatal(err)
			}
		}, "no such file", true, true},
		{"back to one CA", func() { pemFile(t, file, ca1) }, "", true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := r.Pool()
			tc.write()
			err := r.Reload()
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("Reload = %v; want an error containing %q", err, tc.wantErr)
			}
			if tc.wantErr != "" && r.Pool() != before {
				t.Fatal("a failed reload changed the pool in use")
			}
			if trusts(ca1) != tc.ca1 || trusts(ca2) != tc.ca2 {
				t.Fatalf("trusts CA1 %v, CA2 %v; want %v, %v", trusts(ca1), trusts(ca2), tc.ca1, tc.ca2)
			}
		})
	}
}

// TestServerVerifier: the verifier ClientConfig puts in place of crypto/
// tls's own check (so that a reloaded ca_file counts) refuses and accepts
// exactly the servers crypto/tls's default verification does, through
// real handshakes: an unknown CA, another name, an expired certificate, a
// certificate not for servers, a chain missing its intermediate are
// refused; the CA's own and one through an intermediate are accepted, by
// IP address (through WithServerName) and by name. After a reload to
// another CA, its servers are accepted and the first's refused.
func TestServerVerifier(t *testing.T) {
	root := newTestCA(t, "root", nil)
	inter := newTestCA(t, "intermediate", root)
	other := newTestCA(t, "other", nil)
	dir := t.TempDir()
	file := pemFile(t, filepath.Join(dir, "ca.pem"), root)

	for _, tc := range []struct {
		name       string
		cert       tls.Certificate
		host       string // dialed; "" with serverName
		serverName string // server_name
		wantErr    string // "" accepted
	}{
		{"signed by the CA, by IP", root.leaf(t, localhost), "127.0.0.1", "", ""},
		{"signed by the CA, by name", root.leaf(t, localhost), "localhost", "", ""},
		{"through an intermediate", inter.leaf(t, localhost), "127.0.0.1", "", ""},
		{"server_name", root.leaf(t, leafSpec{dns: []string{"node.example"}, usage: x509.ExtKeyUsageServerAuth}), "127.0.0.1", "node.example", ""},
		{"unknown CA", other.leaf(t, localhost), "127.0.0.1", "", "unknown authority"},
		{"wrong IP", root.leaf(t, localhost), "127.0.0.2", "", "127.0.0.2"},
		{"wrong name", root.leaf(t, localhost), "node.example", "", "node.example"},
		{"server_name not in the certificate", root.leaf(t, localhost), "127.0.0.1", "node.example", "node.example"},
		{"expired", root.leaf(t, leafSpec{dns: []string{"localhost"}, ips: localhost.ips, usage: x509.ExtKeyUsageServerAuth, notAfter: time.Now().Add(-time.Minute)}), "127.0.0.1", "", "expired"},
		{"a client certificate", root.leaf(t, leafSpec{ips: localhost.ips, usage: x509.ExtKeyUsageClientAuth}), "127.0.0.1", "", "usage"},
		{"intermediate not sent", inter.leaf(t, leafSpec{dns: []string{"localhost"}, ips: localhost.ips, usage: x509.ExtKeyUsageServerAuth, noChain: true}), "127.0.0.1", "", "unknown authority"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := TLS{Enabled: true, CAFile: file, ServerName: tc.serverName}.ClientConfig()
			if err != nil {
				t.Fatal(err)
			}
			server := &tls.Config{Certificates: []tls.Certificate{tc.cert}}
			got, _ := handshake(t, WithServerName(cfg, tc.host), server)
			if tc.wantErr == "" && got != nil || tc.wantErr != "" && (got == nil || !strings.Contains(got.Error(), tc.wantErr)) {
				t.Fatalf("handshake = %v; want an error containing %q", got, tc.wantErr)
			}
			// crypto/tls's default verification of the same server agrees.
			pool := x509.NewCertPool()
			pool.AddCert(root.cert)
			name := tc.serverName
			if name == "" {
				name = tc.host
			}
			def, _ := handshake(t, &tls.Config{RootCAs: pool, ServerName: name, MinVersion: tls.VersionTLS12}, server)
			if (def == nil) != (got == nil) {
				t.Fatalf("handshake = %v; crypto/tls's own verification = %v", got, def)
			}
		})
	}

	t.Run("no server name", func(t *testing.T) {
		cfg, err := TLS{Enabled: true, CAFile: file}.ClientConfig()
		if err != nil {
			t.Fatal(err)
		}
		server := &tls.Config{Certificates: []tls.Certificate{root.leaf(t, localhost)}}
		if got, _ := handshake(t, cfg, server); got == nil || !strings.Contains(got.Error(), "no server name") {
			t.Fatalf("handshake without a server name = %v; want refused", got)
		}
	})

	t.Run("after a reload", func(t *testing.T) {
		cfg, err := TLS{Enabled: true, CAFile: file}.ClientConfig()
		if err != nil {
			t.Fatal(err)
		}
		cfg = WithServerName(cfg, "127.0.0.1")
		byRoot := &tls.Config{Certificates: []tls.Certificate{root.leaf(t, localhost)}}
		byOther := &tls.Config{Certificates: []tls.Certificate{other.leaf(t, localhost)}}
		pemFile(t, file, other)
		r, err := NewCAReloader("ca_file", file)
		if err != nil {
			t.Fatal(err)
		}
		// The reload SIGHUP runs, on the Config already in use.
		if err := r.Reload(); err != nil {
			t.Fatal(err)
		}
		if got, _ := handshake(t, cfg, byOther); got != nil {
			t.Fatalf("a server of the new CA: %v; want accepted", got)
		}
		if got, _ := handshake(t, cfg, byRoot); got == nil || !strings.Contains(got.Error(), "unknown authority") {
			t.Fatalf("a server of the old CA: %v; want refused", got)
		}
	})
}

// TestServerClientCAReload: the listener's client_ca_file is read again
// on Reload, and the next handshakes check client certificates against
// the new CAs; until a reload the Config served is the same one, so a
// handshake makes no Clone.
func TestServerClientCAReload(t *testing.T) {
	ca1, ca2 := newTestCA(t, "CA1", nil), newTestCA(t, "CA2", nil)
	dir := t.TempDir()
	srvCert := ca1.leaf(t, localhost)
	certFile, keyFile := filepath.Join(dir, "server.pem"), filepath.Join(dir, "server-key.pem")
	keyDER, err := x509.MarshalECPrivateKey(srvCert.PrivateKey.(*ecdsa.PrivateKey))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srvCert.Certificate[0]}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	caFile := pemFile(t, filepath.Join(dir, "clients.pem"), ca1)
	srv, err := ServerTLS{Enabled: true, CertFile: certFile, KeyFile: keyFile, ClientCAFile: caFile}.ServerConfig()
	if err != nil {
		t.Fatal(err)
	}
	r, err := NewCAReloader("client_ca_file", caFile)
	if err != nil {
		t.Fatal(err)
	}
	served := func() *tls.Config {
		c, err := srv.GetConfigForClient(nil)
		if err != nil || c == nil {
			t.Fatalf("GetConfigForClient = %v, %v", c, err)
		}
		return c
	}
	if a, b := served(), served(); a != b || a.ClientCAs != r.Pool() || a.ClientAuth != tls.RequireAndVerifyClientCert {
		t.Fatal("GetConfigForClient made a new Config without a reload, or one without the CAs in use")
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca1.cert)
	client := func(ca *testCA) *tls.Config {
		cert := ca.leaf(t, leafSpec{usage: x509.ExtKeyUsageClientAuth})
		// Shown whatever CAs the server names, so that its check of the
		// chain is what refuses.
		return &tls.Config{RootCAs: roots, ServerName: "127.0.0.1",
			GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &cert, nil }}
	}
	for _, tc := range []struct {
		name     string
		file     []*testCA // written before the reload; nil: as it is
		remove   bool      // the file removed before the reload
		ca1, ca2 bool      // whose clients are accepted after the reload
	}{
		{"at start", nil, false, true, false},
		{"both CAs", []*testCA{ca1, ca2}, false, true, true},
		{"the new CA only", []*testCA{ca2}, false, false, true},
		{"file gone: kept", nil, true, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.file != nil {
				pemFile(t, caFile, tc.file...)
			}
			if tc.remove {
				if err := os.Remove(caFile); err != nil {
					t.Fatal(err)
				}
			}
			if err := r.Reload(); (err != nil) != tc.remove {
				t.Fatalf("Reload = %v", err)
			}
			for i, ca := range []*testCA{ca1, ca2} {
				_, serr := handshake(t, client(ca), srv)
				if want := []bool{tc.ca1, tc.ca2}[i]; (serr == nil) != want {
					t.Fatalf("CA%d's client: server's handshake = %v; want accepted %v", i+1, serr, want)
				}
				if serr != nil && !errors.As(serr, new(x509.UnknownAuthorityError)) && !strings.Contains(serr.Error(), "unknown authority") {
					t.Fatalf("CA%d's client refused with %v; want an unknown authority", i+1, serr)
				}
			}
		})
	}
}

// BenchmarkConfigForClient is what client_ca_file's reload costs each
// handshake on the listener between reloads (go test -run - -bench
// ConfigForClient ./conf/).
func BenchmarkConfigForClient(b *testing.B) {
	ca := harness.NewTestCA(b)
	f := ca.Server()
	srv, err := ServerTLS{Enabled: true, CertFile: f.Cert, KeyFile: f.Key, ClientCAFile: ca.CAFile}.ServerConfig()
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if _, err := srv.GetConfigForClient(nil); err != nil {
			b.Fatal(err)
		}
	}
}
