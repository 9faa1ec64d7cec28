package conf

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
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
// skip the verification.
type TLS struct {
	Enabled    bool   `yaml:"enabled"`
	CAFile     string `yaml:"ca_file"`
	CertFile   string `yaml:"cert_file"`
	KeyFile    string `yaml:"key_file"`
	ServerName string `yaml:"server_name"` // default: the host of each address
}

// ClientConfig is the TLS configuration t describes, nil when TLS is off.
// Each connection sets ServerName from its address unless t does.
func (t TLS) ClientConfig() (*tls.Config, error) {
	if !t.Enabled {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: t.ServerName}
	if t.CAFile != "" {
		pool, err := loadCAs("ca_file", t.CAFile)
		if err != nil {
			return nil, err
		}
		cfg.RootCAs = pool
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

// loadCAs reads the PEM certificates of file (the value of key).
func loadCAs(key, file string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", key, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s: no PEM certificate in %s", key, file)
	}
	return pool, nil
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

// validate adds t's problems under key (upstream.tls, redlock.tls).
func (t TLS) validate(v *validator, key string) {
	if !t.Enabled {
		if t.CAFile != "" || t.CertFile != "" || t.KeyFile != "" || t.ServerName != "" {
			v.add(key+".enabled", "is false while other %s keys are set: set it to true, or remove them", key)
		}
		return
	}
	if _, err := t.ClientConfig(); err != nil {
		v.add(key, "%v", err)
	}
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
// must also show a certificate that CA signed (mutual TLS).
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
		pool, err := loadCAs("client_ca_file", t.ClientCAFile)
		if err != nil {
			return nil, err
		}
		cfg.ClientCAs = pool
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return cfg, nil
}

func (t ServerTLS) validate(v *validator) {
	if !t.Enabled {
		if t.CertFile != "" || t.KeyFile != "" || t.ClientCAFile != "" {
			v.add("tls.enabled", "is false while other tls keys are set: set it to true, or remove them")
		}
		return
	}
	if _, err := t.ServerConfig(); err != nil {
		v.add("tls", "%v", err)
	}
}

func (t *ServerTLS) resolve(dir string) {
	for _, p := range []*string{&t.CertFile, &t.KeyFile, &t.ClientCAFile} {
		if *p != "" && !filepath.IsAbs(*p) {
			*p = filepath.Join(dir, *p)
		}
	}
}
