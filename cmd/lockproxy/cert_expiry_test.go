package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lockproxy/lockproxy/conf"
)

// TestCertExpiryOneSeriesPerFile: one certificate file loaded with two
// spellings of its key's path (tls.key_file "/etc/lp/key.pem",
// redlock.tls.key_file "/etc/lp//key.pem", or the key in a combined PEM
// once and apart once) makes two reloaders with the same cert_file. Each
// gave a series with the same label value, so that every scrape of
// /metrics failed ("collected before with the same name and label
// values"): one series per cert_file, the earliest expiry.
func TestCertExpiryOneSeriesPerFile(t *testing.T) {
	dir := t.TempDir()
	certFile := filepath.Join(dir, "cert.pem")
	keyFile := filepath.Join(dir, "key.pem")
	writeSelfSigned(t, certFile, keyFile)
	if _, err := conf.NewCertReloader(certFile, keyFile); err != nil {
		t.Fatal(err)
	}
	if _, err := conf.NewCertReloader(certFile, dir+"//key.pem"); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(certExpiry{})
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("Gather = %v; want the expiry metric served", err)
	}
	n := 0
	for _, mf := range mfs {
		if mf.GetName() == "lockproxy_tls_certificate_expiry_timestamp_seconds" {
			for _, m := range mf.GetMetric() {
				if m.GetLabel()[0].GetValue() == certFile {
					n++
				}
			}
		}
	}
	if n != 1 {
		t.Errorf("series for %s = %d; want 1", certFile, n)
	}
}

// writeSelfSigned writes a self-signed certificate and its key.
func writeSelfSigned(t *testing.T, certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "lockproxy test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		DNSNames: []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
}
