package resp

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"math/big"
	"net"
	"testing"
	"time"
)

// tlsListener is a TCP listener on a free loopback port, the server
// configuration (Server.TLSConfig) of a self-signed certificate for
// 127.0.0.1, and a client configuration that trusts it.
func tlsListener(t *testing.T) (net.Listener, *tls.Config, *tls.Config) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(cert)
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return raw, &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}},
		&tls.Config{RootCAs: roots, ServerName: "127.0.0.1"}
}

type pongHandler struct{}

func (pongHandler) ServeRESP(s *Session, args [][]byte) { s.W.Simple("PONG") }
func (pongHandler) Closed(*Session)                     {}

func tlsPing(addr string, cfg *tls.Config) error {
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 3 * time.Second}, "tcp", addr, cfg)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err == nil && line != "+PONG\r\n" {
		err = fmt.Errorf("PING answered %q", line)
	}
	return err
}

// TestTLSAcceptSilentPeers: TCP peers that never start the TLS handshake
// neither stop the server from accepting (the refusal at max clients runs
// the handshake, not on the accept loop) nor keep their connection slot
// past the handshake timeout.
func TestTLSAcceptSilentPeers(t *testing.T) {
	old := tlsHandshakeTimeout
	tlsHandshakeTimeout = 300 * time.Millisecond
	defer func() { tlsHandshakeTimeout = old }()

	ln, server, client := tlsListener(t)
	srv := &Server{Handler: pongHandler{}, MaxClients: 1, TLSConfig: server}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		<-done
	}()
	addr := ln.Addr().String()

	silent, err := net.Dial("tcp", addr) // takes the one slot, says nothing
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	refused, err := net.Dial("tcp", addr) // over the limit, says nothing either
	if err != nil {
		t.Fatal(err)
	}
	defer refused.Close()
	// The handshake timeout frees the slot; a client gets it although
	// the refused peer is still silent.
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := tlsPing(addr, client)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no TLS client served with silent peers around: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
