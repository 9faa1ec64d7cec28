package conf

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"
)

// TLS is a TLS client connection to Redis servers (upstream.tls,
// redlock.tls). lockproxy verifies each server's certificate against
// ca_file, or the system's roots without it, and the name it dials (or
// server_name); cert_file and key_file are its own certificate, for a
// server that asks for one (Redis's tls-auth-clients). There is no way to
// skip the verification. ca_file, cert_file and key_file are read again
// on SIGHUP (CAReloaders, Reloaders).
type TLS struct {
	Enabled    bool   `yaml:"enabled"`
	CAFile     string `yaml:"ca_file"`
	CertFile   string `yaml:"cert_file"`
	KeyFile    string `yaml:"key_file"`
	ServerName string `yaml:"server_name"` // default: the host of each address
}

// ClientConfig is the TLS configuration t describes, nil when TLS is off.
// Each connection sets ServerName from its address unless t does.
//
// With ca_file, the server's certificate is checked by VerifyConnection
// against the CAs the file holds now (crypto/tls reads RootCAs from a
// Config that cannot change once in use, so a reloaded CA file could not
// reach it): InsecureSkipVerify only turns off crypto/tls's own check,
// which ServerVerifier does as strictly. That verifier checks the name in
// the ConnectionState, which crypto/tls leaves empty for an IP address: a
// connection that sets ServerName on a Clone must set it there too
// (WithServerName).
func (t TLS) ClientConfig() (*tls.Config, error) {
	if !t.Enabled {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: t.ServerName}
	if t.CAFile != "" {
		r, err := NewCAReloader("ca_file", t.CAFile)
		if err != nil {
			return nil, err
		}
		cfg.InsecureSkipVerify = true
		cfg.VerifyConnection = r.ServerVerifier(t.ServerName)
	}
	switch {
	case t.CertFile != "" && t.KeyFile != "":
		r, err := NewCertReloader(t.CertFile, t.KeyFile)
		if err != nil {
			return nil, err
		}
		cfg.GetClientCertificate = r.clientCertificate
	case t.CertFile != "" || t.KeyFile != "":
		return nil, errors.New("cert_file and key_file go together")
	}
	return cfg, nil
}

// WithServerName is base for a connection to the server named name (the
// host it dials): base itself when it names its server already or is nil,
// else a Clone with ServerName set, and name given to the verifier of a
// reloadable ca_file (ClientConfig), which cannot see the Clone's
// ServerName and for an IP address gets no name from crypto/tls.
func WithServerName(base *tls.Config, name string) *tls.Config {
	if base == nil || base.ServerName != "" {
		return base
	}
	cfg := base.Clone()
	cfg.ServerName = name
	if verify := base.VerifyConnection; verify != nil {
		cfg.VerifyConnection = func(cs tls.ConnectionState) error {
			cs.ServerName = name
			return verify(cs)
		}
	}
	return cfg
}

// HandshakeNoReplyError is a TLS client handshake whose deadline passed
// before the server sent its hello: most likely TLS is on towards a port
// that speaks plain text (a Redis without tls-port there), which waits for
// a command and never answers the ClientHello. Said as a plain timeout,
// that misconfiguration reads like a slow or dead server.
type HandshakeNoReplyError struct {
	Err error // the deadline's error
}

func (e *HandshakeNoReplyError) Error() string { return e.Reason() + ": " + e.Err.Error() }
func (e *HandshakeNoReplyError) Unwrap() error { return e.Err }

// Reason is the few words error replies give (quorum.Reason, the relay's
// "upstream unavailable").
func (e *HandshakeNoReplyError) Reason() string {
	return "tls handshake: no reply (is TLS enabled on this port?)"
}

// Handshake runs tc's client handshake within ctx and the deadline set on
// its connection. A handshake that ran out of time before the server's
// hello came fails with a *HandshakeNoReplyError.
func Handshake(ctx context.Context, tc *tls.Conn) error {
	err := tc.HandshakeContext(ctx)
	// The version is set once the ServerHello is read: still 0, the
	// server said nothing a TLS client could read.
	if err != nil && timeout(err) && tc.ConnectionState().Version == 0 {
		return &HandshakeNoReplyError{Err: err}
	}
	return err
}

// timeout tells whether err is a deadline that passed: ctx's, or the
// connection's.
func timeout(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded) ||
		errors.As(err, &ne) && ne.Timeout()
}

// loadCAs reads the PEM certificates of file.
func loadCAs(file string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("no PEM certificate in %s", file)
	}
	return pool, nil
}

// CAReloader holds the CA certificates of a file (ca_file,
// client_ca_file), and reads them again on Reload (SIGHUP), so that a
// rotated CA is trusted by the next handshakes without a restart, which
// would drop every client's connection and the KEEPALIVE locks held
// through them. Open connections are not checked again. Every reloader
// made is listed (CAReloaders) for the signal handler.
type CAReloader struct {
	file string
	cur  atomic.Pointer[x509.CertPool]
}

var caReloaders = map[string]*CAReloader{} // by file, under reloadersMu

// NewCAReloader reads file (the value of key, which errors name). The
// same file gives the same reloader, read again.
func NewCAReloader(key, file string) (*CAReloader, error) {
	reloadersMu.Lock()
	defer reloadersMu.Unlock()
	r := caReloaders[file]
	if r == nil {
		r = &CAReloader{file: file}
	}
	if err := r.Reload(); err != nil {
		return nil, fmt.Errorf("%s: %w", key, err)
	}
	caReloaders[file] = r
	return r, nil
}

// Reload reads the file again; on an error (no file, no PEM certificate
// in it) the CAs in use stay.
func (r *CAReloader) Reload() error {
	pool, err := loadCAs(r.file)
	if err != nil {
		return err
	}
	r.cur.Store(pool)
	return nil
}

// File names the CA file.
func (r *CAReloader) File() string { return r.file }

// Pool is the CAs in use. A reload stores a new pool; one in use is never
// changed.
func (r *CAReloader) Pool() *x509.CertPool { return r.cur.Load() }

// ServerVerifier is a tls.Config.VerifyConnection that checks the
// server's certificate as crypto/tls does without InsecureSkipVerify, but
// against the CAs in use at each handshake: the chain, through the
// intermediates the server sent, to one of them; the validity period; the
// ServerAuth key usage; and the name, name or else the one the
// ConnectionState gives (see WithServerName). With neither it refuses,
// as crypto/tls refuses a Config with no ServerName.
func (r *CAReloader) ServerVerifier(name string) func(tls.ConnectionState) error {
	return func(cs tls.ConnectionState) error {
		host := name
		if host == "" {
			host = cs.ServerName
		}
		if host == "" {
			return errors.New("tls: no server name to verify the certificate against")
		}
		if len(cs.PeerCertificates) == 0 {
			return errors.New("tls: the server sent no certificate")
		}
		opts := x509.VerifyOptions{
			Roots:         r.Pool(),
			CurrentTime:   time.Now(),
			DNSName:       host,
			Intermediates: x509.NewCertPool(),
			KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		}
		for _, c := range cs.PeerCertificates[1:] {
			opts.Intermediates.AddCert(c)
		}
		if _, err := cs.PeerCertificates[0].Verify(opts); err != nil {
			// crypto/tls's own error, so that a refusal reads the same.
			return &tls.CertificateVerificationError{UnverifiedCertificates: cs.PeerCertificates, Err: err}
		}
		return nil
	}
}

// CAReloaders lists every CA reloader made so far.
func CAReloaders() []*CAReloader {
	reloadersMu.Lock()
	defer reloadersMu.Unlock()
	out := make([]*CAReloader, 0, len(caReloaders))
	for _, r := range caReloaders {
		out = append(out, r)
	}
	return out
}

// CertReloader serves a certificate read from its files, and reads them
// again on Reload (SIGHUP), so that a renewed certificate takes effect
// for the next handshakes without a restart: a restart would drop every
// client's connection and the KEEPALIVE locks held through them. Every
// reloader made is listed (Reloaders) for the signal handler.
type CertReloader struct {
	certFile, keyFile string
	cur               atomic.Pointer[tls.Certificate]
}

var (
	reloadersMu sync.Mutex
	reloaders   = map[[2]string]*CertReloader{}
)

// NewCertReloader reads certFile and keyFile. The same pair gives the same
// reloader.
func NewCertReloader(certFile, keyFile string) (*CertReloader, error) {
	reloadersMu.Lock()
	defer reloadersMu.Unlock()
	if r := reloaders[[2]string{certFile, keyFile}]; r != nil {
		return r, r.Reload()
	}
	r := &CertReloader{certFile: certFile, keyFile: keyFile}
	if err := r.Reload(); err != nil {
		return nil, err
	}
	reloaders[[2]string{certFile, keyFile}] = r
	return r, nil
}

// Reload reads the files again; on an error the certificate in use stays.
func (r *CertReloader) Reload() error {
	cert, err := tls.LoadX509KeyPair(r.certFile, r.keyFile)
	if err != nil {
		return fmt.Errorf("cert_file, key_file: %w", err)
	}
	r.cur.Store(&cert)
	return nil
}

// Files names the certificate's files.
func (r *CertReloader) Files() (cert, key string) { return r.certFile, r.keyFile }

// NotAfter is when the certificate in use expires.
func (r *CertReloader) NotAfter() time.Time {
	c := r.cur.Load()
	if c == nil || len(c.Certificate) == 0 {
		return time.Time{}
	}
	if c.Leaf != nil {
		return c.Leaf.NotAfter
	}
	x, err := x509.ParseCertificate(c.Certificate[0])
	if err != nil {
		return time.Time{}
	}
	return x.NotAfter
}

func (r *CertReloader) certificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return r.cur.Load(), nil
}

func (r *CertReloader) clientCertificate(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	return r.cur.Load(), nil
}

// Reloaders lists every certificate reloader made so far.
func Reloaders() []*CertReloader {
	reloadersMu.Lock()
	defer reloadersMu.Unlock()
	out := make([]*CertReloader, 0, len(reloaders))
	for _, r := range reloaders {
		out = append(out, r)
	}
	return out
}

// validate adds t's problems under key (upstream.tls, redlock.tls), one
// per key at fault (key.ca_file, key.cert_file, key.key_file), each file
// loaded as ClientConfig would: ClientConfig stops at its first error, and
// check-config must name every file that would not load.
func (t TLS) validate(v *validator, key string) {
	if !t.Enabled {
		if t.CAFile != "" || t.CertFile != "" || t.KeyFile != "" || t.ServerName != "" {
			v.add(key+".enabled", "is false while other %s keys are set: set it to true, or remove them", key)
		}
		return
	}
	if t.CAFile != "" {
		if _, err := loadCAs(t.CAFile); err != nil {
			v.add(key+".ca_file", "%v", err)
		}
	}
	switch {
	case t.CertFile == "" && t.KeyFile == "":
		// No client certificate: the server may not ask for one.
	case t.CertFile == "":
		v.add(key+".cert_file", "is required with %s.key_file: the two go together", key)
		checkReadable(v, key+".key_file", t.KeyFile)
	case t.KeyFile == "":
		v.add(key+".key_file", "is required with %s.cert_file: the two go together", key)
		checkCert(v, key+".cert_file", t.CertFile)
	default:
		checkKeyPair(v, key, t.CertFile, t.KeyFile)
	}
}

// checkKeyPair adds the problems of a certificate and its key, as
// NewCertReloader would load them, under key.cert_file and key.key_file:
// each file that cannot be read or holds no certificate, or else the key
// when it does not go with the certificate.
func checkKeyPair(v *validator, key, certFile, keyFile string) {
	certPEM, certOK := checkCert(v, key+".cert_file", certFile)
	keyPEM, keyOK := checkReadable(v, key+".key_file", keyFile)
	if !certOK || !keyOK {
		return
	}
	// The certificate parses (checkCert): what X509KeyPair refuses now is
	// the key, missing from the file, unreadable or not the certificate's.
	if _, err := tls.X509KeyPair(certPEM, keyPEM); err != nil {
		v.add(key+".key_file", "%s: %v", keyFile, err)
	}
}

// checkReadable adds key's problem when file cannot be read, and returns
// its contents.
func checkReadable(v *validator, key, file string) ([]byte, bool) {
	b, err := os.ReadFile(file)
	if err != nil {
		v.add(key, "%v", err)
		return nil, false
	}
	return b, true
}

// checkCert adds key's problem when file cannot be read or holds no PEM
// certificate that parses, and returns its contents.
func checkCert(v *validator, key, file string) ([]byte, bool) {
	b, ok := checkReadable(v, key, file)
	if !ok {
		return nil, false
	}
	for rest := b; ; {
		var blk *pem.Block
		if blk, rest = pem.Decode(rest); blk == nil {
			break
		}
		if blk.Type != "CERTIFICATE" {
			continue
		}
		if _, err := x509.ParseCertificate(blk.Bytes); err != nil {
			v.add(key, "%s: %v", file, err)
			return nil, false
		}
		return b, true
	}
	v.add(key, "no PEM certificate in %s", file)
	return nil, false
}

// resolve makes t's file paths relative to dir, the directory of the
// config file that named them.
func (t *TLS) resolve(dir string) {
	for _, p := range []*string{&t.CAFile, &t.CertFile, &t.KeyFile} {
		if *p != "" && !filepath.IsAbs(*p) {
			*p = filepath.Join(dir, *p)
		}
	}
}

// ServerTLS is TLS on lockproxy's own listener (tls): every client
// connection must speak TLS 1.2 or later. With client_ca_file, clients
// must also show a certificate that CA signed (mutual TLS). Every file is
// read again on SIGHUP.
type ServerTLS struct {
	Enabled      bool   `yaml:"enabled"`
	CertFile     string `yaml:"cert_file"`
	KeyFile      string `yaml:"key_file"`
	ClientCAFile string `yaml:"client_ca_file"`
}

// ServerConfig is the TLS configuration t describes, nil when TLS is off.
func (t ServerTLS) ServerConfig() (*tls.Config, error) {
	if !t.Enabled {
		return nil, nil
	}
	if t.CertFile == "" || t.KeyFile == "" {
		return nil, errors.New("cert_file and key_file are required")
	}
	r, err := NewCertReloader(t.CertFile, t.KeyFile)
	if err != nil {
		return nil, err
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: r.certificate}
	if t.ClientCAFile != "" {
		cas, err := NewCAReloader("client_ca_file", t.ClientCAFile)
		if err != nil {
			return nil, err
		}
		cfg.ClientCAs = cas.Pool()
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
		cc := &clientCAs{cas: cas, base: cfg.Clone()}
		cc.cur.Store(cc.base)
		cfg.GetConfigForClient = cc.configForClient
	}
	return cfg, nil
}

// clientCAs serves the listener's configuration with the client CAs in
// use: crypto/tls reads ClientCAs from the Config of each handshake,
// which GetConfigForClient may replace. A handshake costs an atomic load
// and a comparison; a Clone is made once per reload.
type clientCAs struct {
	cas  *CAReloader
	base *tls.Config // the listener's, without GetConfigForClient
	cur  atomic.Pointer[tls.Config]
}

func (c *clientCAs) configForClient(*tls.ClientHelloInfo) (*tls.Config, error) {
	pool := c.cas.Pool()
	cfg := c.cur.Load()
	if cfg.ClientCAs == pool {
		return cfg, nil
	}
	next := c.base.Clone()
	next.ClientCAs = pool
	// Another handshake may have stored one for pool, or for a later
	// reload, meanwhile: either serves, so no retry.
	c.cur.CompareAndSwap(cfg, next)
	return next, nil
}

// validate adds t's problems, one per key at fault (tls.cert_file,
// tls.key_file, tls.client_ca_file), each file loaded as ServerConfig
// would; ServerConfig stops at its first error.
func (t ServerTLS) validate(v *validator) {
	if !t.Enabled {
		if t.CertFile != "" || t.KeyFile != "" || t.ClientCAFile != "" {
			v.add("tls.enabled", "is false while other tls keys are set: set it to true, or remove them")
		}
		return
	}
	switch {
	case t.CertFile == "" || t.KeyFile == "":
		if t.CertFile == "" {
			v.add("tls.cert_file", "is required when tls.enabled is true")
		} else {
			checkCert(v, "tls.cert_file", t.CertFile)
		}
		if t.KeyFile == "" {
			v.add("tls.key_file", "is required when tls.enabled is true")
		} else {
			checkReadable(v, "tls.key_file", t.KeyFile)
		}
	default:
		checkKeyPair(v, "tls", t.CertFile, t.KeyFile)
	}
	if t.ClientCAFile != "" {
		if _, err := loadCAs(t.ClientCAFile); err != nil {
			v.add("tls.client_ca_file", "%v", err)
		}
	}
}

func (t *ServerTLS) resolve(dir string) {
	for _, p := range []*string{&t.CertFile, &t.KeyFile, &t.ClientCAFile} {
		if *p != "" && !filepath.IsAbs(*p) {
			*p = filepath.Join(dir, *p)
		}
	}
}
