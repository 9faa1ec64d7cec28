package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCheckConfigListsEveryProblem: `lockproxy check-config FILE` exits 1
// and lists every problem of the file, each under its key path
// (PROTOCOL.md: "exit 0 or 1 with every problem listed"), whatever kind of
// problem comes first: an unknown key, an unreadable secret file, or a bad
// TLS block. Listing only the first kind makes an operator fix, re-run and
// fix again.
func TestCheckConfigListsEveryProblem(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name string
		yaml string
		want []string // each must show in the output
	}{
		{"an unknown key and bad values",
			"listen: nowhere\nredlock:\n  nodes: [127.0.0.1:7001]\n  nodez: [a]\n  drift_factor: 0.7\n",
			[]string{"redlock.nodez: unknown key", "listen: want host:port", "redlock.drift_factor: must be in"}},
		{"a type error and a bad value",
			"redlock:\n  nodes: [127.0.0.1:7001]\n  pool_size: many\n  drift_factor: 0.7\n",
			[]string{"redlock.pool_size: ", "redlock.drift_factor: must be in"}},
		{"a missing password_file and a bad value",
			"redlock:\n  nodes: [127.0.0.1:7001]\n  password_file: nope\n  drift_factor: 0.7\n",
			[]string{"redlock.password_file: ", "nope", "redlock.drift_factor: must be in"}},
		{"missing digest_file and dsn_file",
			"redlock:\n  nodes: [127.0.0.1:7001]\nzookeeper: {digest_file: nope-digest}\npostgres: {dsn_file: nope-dsn}\n",
			[]string{"zookeeper.digest_file: ", "nope-digest", "postgres.dsn_file: ", "nope-dsn"}},
		{"redlock.tls: a missing ca_file and missing certificate files",
			"redlock:\n  nodes: [127.0.0.1:7001]\n  tls: {enabled: true, ca_file: nope-ca.pem, cert_file: nope-cert.pem, key_file: nope-key.pem}\n",
			[]string{"redlock.tls.ca_file: ", "nope-ca.pem", "redlock.tls.cert_file: ", "nope-cert.pem", "redlock.tls.key_file: ", "nope-key.pem"}},
		{"listener tls: no cert_file and a missing client_ca_file",
			"redlock:\n  nodes: [127.0.0.1:7001]\ntls: {enabled: true, key_file: k.pem, client_ca_file: nope-ca.pem}\n",
			[]string{"tls.cert_file: ", "tls.key_file: ", "k.pem", "tls.client_ca_file: ", "nope-ca.pem"}},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := filepath.Join(dir, "c"+string(rune('0'+i))+".yaml")
			if err := os.WriteFile(p, []byte(tt.yaml), 0o600); err != nil {
				t.Fatal(err)
			}
			var stdout, stderr bytes.Buffer
			code := checkConfig([]string{p}, nil, &stdout, &stderr)
			out := stdout.String() + stderr.String()
			if code != 1 {
				t.Fatalf("check-config exited %d; want 1\n%s", code, out)
			}
			for _, w := range tt.want {
				if !strings.Contains(out, w) {
					t.Errorf("check-config output lacks %q:\n%s", w, out)
				}
			}
		})
	}
}

// TestCheckConfigWarnsUnknownEnv: check-config names a LOCKPROXY_*
// variable that matches no key, with the closest known one, but still
// passes the file: a typo must be seen, and test variables sharing the
// environment must not fail the check.
func TestCheckConfigWarnsUnknownEnv(t *testing.T) {
	p := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(p, []byte("redlock:\n  nodes: [127.0.0.1:7001]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	code := checkConfig([]string{p}, []string{"LOCKPROXY_TLS_CLIENTCA_FILE=/x.pem", "LOCKPROXY_SOAK=1"}, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("check-config exited %d; want 0\n%s%s", code, stdout.String(), stderr.String())
	}
	if w := stderr.String(); !strings.Contains(w, "LOCKPROXY_TLS_CLIENTCA_FILE") || !strings.Contains(w, "LOCKPROXY_TLS_CLIENT_CA_FILE") ||
		strings.Contains(w, "LOCKPROXY_SOAK") {
		t.Errorf("check-config warnings = %q; want LOCKPROXY_TLS_CLIENTCA_FILE named with LOCKPROXY_TLS_CLIENT_CA_FILE, and LOCKPROXY_SOAK not", w)
	}
}
