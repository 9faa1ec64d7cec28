// Command lockproxy is a Redis-protocol server that serves distributed
// locks (LOCK, UNLOCK, RENEW) from a quorum of independent Redis nodes
// (RedLock) or from a ZooKeeper ensemble.
//
// Usage:
//
//	lockproxy [flags] [config.yaml]
//	lockproxy --dev
//	lockproxy check-config FILE
//	lockproxy --version
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/pprof"
	"net/netip"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/lockproxy/lockproxy/backends"
	pgbackend "github.com/lockproxy/lockproxy/backends/postgres"
	redisbackend "github.com/lockproxy/lockproxy/backends/redis"
	zkbackend "github.com/lockproxy/lockproxy/backends/zookeeper"
	"github.com/lockproxy/lockproxy/commands"
	"github.com/lockproxy/lockproxy/conf"
	"github.com/lockproxy/lockproxy/internal/procs"
	"github.com/lockproxy/lockproxy/internal/sdnotify"
	"github.com/lockproxy/lockproxy/quorum"
	"github.com/lockproxy/lockproxy/relay"
	"github.com/lockproxy/lockproxy/resp"
)

// version is set at build time with -ldflags "-X main.version=…".
var version = "0.1.0-dev"

// buildCommit is set by the Makefile with -ldflags "-X main.buildCommit=…":
// Go stamps the commit itself only where VCS stamping is on (GOFLAGS
// -buildvcs=false, or a build from outside the checkout, leaves none).
var buildCommit = ""

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func commit() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		rev, dirty := "", false
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
		if len(rev) > 12 {
			rev = rev[:12]
		}
		if rev != "" && dirty {
			rev += "-dirty"
		}
		if rev != "" {
			return rev
		}
	}
	if buildCommit != "" {
		return buildCommit
	}
	return "unknown"
}

// gcPercent is the GC target unless GOGC is set: lockproxy's heap is small
// and short-lived garbage from every command dominates it, so collecting
// less often saves CPU for a few MB (test/bench: about 15 % more cycles/s
// at 64 clients with 400 than with Go's default 100).
const gcPercent = 400

func run(args []string, stdout, stderr io.Writer) int {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(gcPercent)
	}
	if conf.VersionAsked(args) {
		fmt.Fprintf(stdout, "lockproxy %s (commit %s)\n", version, commit())
		return 0
	}
	if len(args) == 1 && args[0] == "help" {
		// As git and go take it: read as a config file's name, it failed
		// with "open help: no such file".
		args = []string{"--help"}
	}
	if len(args) > 0 && args[0] == "check-config" {
		return checkConfig(args[1:], os.Environ(), stdout, stderr)
	}
	cfg, err := conf.Parse(args, os.Environ())
	if errors.Is(err, flag.ErrHelp) {
		// Asked for, not a mistake: the usage (the error's text) on
		// stdout, where `lockproxy --help | less` finds it, and success.
		fmt.Fprint(stdout, err.Error())
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "lockproxy: %v\n", err)
		// A misspelt variable may be why a setting is missing.
		for _, w := range cfg.Warnings() {
			fmt.Fprintf(stderr, "lockproxy: warning: %s\n", w)
		}
		return 2
	}
	log, err := newLogger(cfg.Log)
	if err != nil {
		fmt.Fprintf(stderr, "lockproxy: %v\n", err)
		return 2
	}
	defer func() { _ = log.Sync() }()
	// go-redis logs through a global logger, plain text on stderr unless
	// told otherwise: set once, before any node client is made, so that
	// every line lockproxy writes is in log.format.
	redisbackend.SetGoRedisLogger(log)
	for _, w := range cfg.Warnings() {
		log.Warn("config: " + w)
	}
	logPlatformLimits(log)

	// SIGTERM or SIGINT starts the drain. One that arrives during the
	// drain is caught too (stop runs only when run returns) and does
	// nothing: the drain is bounded by limits.shutdown_timeout, and
	// SIGKILL (systemd's after TimeoutStopSec) is the way to cut it short.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	// SIGHUP stays caught until run returns, the drain included: with
	// signal.Stop any earlier, Go restores its default action, and a
	// certificate renewal hook's `kill -HUP` during a stop would kill
	// lockproxy mid-drain (commands in flight cut, KEEPALIVE locks left
	// to their leases).
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	hupDone := make(chan struct{})
	defer close(hupDone)
	go reloadOnHUP(ctx, hupDone, hup, log, &systemdReady)
	sizeProcs(ctx, cfg, log)
	if err := serve(ctx, cfg, log, stderr); err != nil {
		log.Error("lockproxy stopped", zap.Error(err))
		return 1
	}
	return 0
}

// sizeProcs sets how many threads run Go code: the number procs fixes;
// GOMAXPROCS's, when it is set (to a number the runtime takes); otherwise
// one, and every one the runtime would give while the load needs it
// (package procs).
func sizeProcs(ctx context.Context, cfg conf.Config, log *zap.Logger) {
	n, _ := cfg.ProcsFixed() // Validate checked it
	env, err := strconv.Atoi(os.Getenv("GOMAXPROCS"))
	switch {
	case n > 0:
		runtime.GOMAXPROCS(n)
	case err == nil && env > 0:
		// The runtime has applied it.
	default:
		c := procs.New(procs.DefaultPolicy)
		c.Changed = func(n int, used float64) {
			log.Debug("procs: threads running Go code changed", zap.Int("procs", n), zap.Float64("cores_used", used))
		}
		go c.Run(ctx)
		return
	}
	log.Debug("procs: fixed", zap.Int("procs", runtime.GOMAXPROCS(0)))
}

// permissions turns auth.permissions, which Validate checked, into the
// handler's.
func permissions(a conf.Auth) map[string]commands.Permission {
	out := map[string]commands.Permission{}
	for _, e := range a.Permissions {
		if p, err := conf.ParsePermission(e); err == nil {
			out[p.User] = commands.Permission{
				Commands: p.Commands, Keys: p.Keys, LimitKeys: p.LimitKeys,
				Channels: p.Channels, LimitChannels: p.LimitChannels,
			}
		}
	}
	return out
}

// certExpiry exports when each TLS certificate in use expires, so that
// an alert can fire before a renewal that did not happen (or a SIGHUP
// that was not sent) breaks the handshakes.
type certExpiry struct{}

var certExpiryDesc = prometheus.NewDesc("lockproxy_tls_certificate_expiry_timestamp_seconds",
	"When each TLS certificate lockproxy presents expires (Unix time), by its cert_file.", []string{"cert_file"}, nil)

func (certExpiry) Describe(ch chan<- *prometheus.Desc) { ch <- certExpiryDesc }

// Collect sends one series per cert_file: the same file loaded with two
// spellings of its key's path is two reloaders, and two series with one
// label value would fail every scrape. The earliest expiry of them is
// the one an alert must see.
func (certExpiry) Collect(ch chan<- prometheus.Metric) {
	earliest := map[string]time.Time{}
	var order []string
	for _, r := range conf.Reloaders() {
		at := r.NotAfter()
		if at.IsZero() {
			continue
		}
		cert, _ := r.Files()
		prev, seen := earliest[cert]
		if !seen {
			order = append(order, cert)
		}
		if !seen || at.Before(prev) {
			earliest[cert] = at
		}
	}
	for _, cert := range order {
		ch <- prometheus.MustNewConstMetric(certExpiryDesc, prometheus.GaugeValue, float64(earliest[cert].Unix()), cert)
	}
}

// systemdReady is set once systemd was told READY=1: a SIGHUP before
// that must not say READY=1, which systemd would take for the start.
var systemdReady atomic.Bool

// reloadOnHUP reads every TLS certificate, key and CA file again on each
// SIGHUP from hup (a renewed certificate, as cert-manager or certbot
// leave it, or a rotated CA), so that new handshakes use them without a
// restart. A file that does not load leaves what was read before in use.
// Once ctx is done (the drain) a SIGHUP is logged and ignored: the
// listener takes no new handshakes, and RELOADING=1 then READY=1 after
// STOPPING=1 would tell systemd the service is up again. It returns when
// done is closed.
func reloadOnHUP(ctx context.Context, done <-chan struct{}, hup <-chan os.Signal, log *zap.Logger, ready *atomic.Bool) {
	for {
		select {
		case <-done:
			return
		case <-hup:
		}
		if ctx.Err() != nil {
			log.Info("SIGHUP during shutdown: ignored; the drain goes on")
			continue
		}
		notify := ready.Load()
		if notify {
			_, _ = sdnotify.Notify(sdnotify.Reloading())
		}
		rs := conf.Reloaders()
		for _, r := range rs {
			cert, _ := r.Files()
			if err := r.Reload(); err != nil {
				log.Error("SIGHUP: certificate not reloaded; the old one stays in use", zap.String("cert_file", cert), zap.Error(err))
				continue
			}
			log.Info("SIGHUP: certificate reloaded", zap.String("cert_file", cert))
		}
		cas := conf.CAReloaders()
		for _, r := range cas {
			if err := r.Reload(); err != nil {
				log.Error("SIGHUP: CA file not reloaded; the CAs read before stay in use", zap.String("ca_file", r.File()), zap.Error(err))
				continue
			}
			log.Info("SIGHUP: CA file reloaded", zap.String("ca_file", r.File()))
		}
		if len(rs) == 0 && len(cas) == 0 {
			log.Info("SIGHUP: no TLS certificate to reload")
		}
		// A drain that began during the reload has said STOPPING=1:
		// READY=1 now would take it back.
		if notify && ctx.Err() == nil {
			_, _ = sdnotify.Notify(sdnotify.Ready)
		}
	}
}

// checkConfig checks FILE as lockproxy would start with it: the
// LOCKPROXY_* variables of environ applied over it (a unit's
// EnvironmentFile may hold the secrets), then Validate, every problem
// listed (conf.Parse). Warnings, such as a LOCKPROXY_* variable that names
// no key, go to stderr and do not change the exit code.
func checkConfig(args []string, environ []string, stdout, stderr io.Writer) int {
	if len(args) != 1 {
		// PROTOCOL.md gives check-config only 0 and 1: a missing or extra
		// FILE is one more problem, listed where the others are.
		fmt.Fprintf(stderr, "usage: lockproxy check-config FILE (got %d arguments)\n", len(args))
		return 1
	}
	var env []string
	for _, kv := range environ {
		if !strings.HasPrefix(kv, "LOCKPROXY_CONFIG=") {
			env = append(env, kv)
		}
	}
	cfg, err := conf.Parse([]string{"--config", args[0]}, env)
	if err != nil {
		fmt.Fprintf(stderr, "%s: invalid\n%v\n", args[0], err)
	}
	for _, w := range cfg.Warnings() {
		fmt.Fprintf(stderr, "warning: %s\n", w)
	}
	if err != nil {
		return 1
	}
	fmt.Fprintf(stdout, "%s: ok\n", args[0])
	return 0
}

func newLogger(c conf.Log) (*zap.Logger, error) {
	var zc zap.Config
	if c.Format == "console" {
		zc = zap.NewDevelopmentConfig()
		zc.DisableStacktrace = true // warnings are for people here, not for debugging
	} else {
		zc = zap.NewProductionConfig()
		zc.EncoderConfig.TimeKey = "ts"
		zc.EncoderConfig.EncodeTime = zapcore.ISO8601TimeEncoder
	}
	lvl, err := zapcore.ParseLevel(c.Level)
	if err != nil {
		return nil, fmt.Errorf("log.level: %w", err)
	}
	zc.Level = zap.NewAtomicLevelAt(lvl)
	zc.Sampling = nil
	return zc.Build()
}

// serve runs lockproxy until ctx is done, then drains it.
func serve(ctx context.Context, cfg conf.Config, log *zap.Logger, banner io.Writer) error {
	nodes := cfg.Redlock.Nodes
	backendLog := log
	if cfg.EmbeddedNodes() {
		// Embedded nodes live and die with this process, so they cannot
		// restart behind its back; miniredis has no INFO server section,
		// and warning about that would only be noise.
		backendLog = log.WithOptions(zap.IncreaseLevel(zapcore.ErrorLevel))
		dev, err := startDevNodes(3)
		if err != nil {
			return err
		}
		clockCtx, stopClock := context.WithCancel(context.Background())
		go devClock(clockCtx, dev)
		defer func() {
			stopClock()
			for _, m := range dev {
				m.Close()
			}
		}()
		for _, m := range dev {
			nodes = append(nodes, m.Addr())
		}
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	buildInfo := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "lockproxy_build_info", Help: "Always 1; labels carry the version and commit.",
	}, []string{"version", "commit"})
	buildInfo.WithLabelValues(version, commit()).Set(1)
	reg.MustRegister(buildInfo)

	var backend backends.Backend
	switch cfg.Backend {
	case conf.BackendZookeeper:
		nodes = cfg.Zookeeper.Servers
		zc := cfg.Zookeeper
		zb, err := zkbackend.New(zkbackend.Config{
			Servers: zc.Servers, Root: zc.Root, SessionTimeout: zc.SessionTimeout, ServerTick: zc.TickTime, Digest: zc.Digest,
			DriftFactor: cfg.Redlock.DriftFactor, DriftMin: cfg.Redlock.DriftMin, Logger: log, Registerer: reg,
		})
		if err != nil {
			return err
		}
		backend = zb
	case conf.BackendPostgres:
		pc := cfg.Postgres
		pb, err := pgbackend.New(pgbackend.Config{
			DSN: pc.DSN, Schema: pc.Schema, TablePrefix: pc.TablePrefix, PoolSize: int32(pc.PoolSize),
			SweepInterval: pc.SweepInterval, OpTimeout: pc.OpTimeout,
			DriftFactor: cfg.Redlock.DriftFactor, DriftMin: cfg.Redlock.DriftMin, Logger: log,
		})
		if err != nil {
			return err
		}
		nodes = []string{pb.Addr()}
		reg.MustRegister(pb.Collector())
		backend = pb
	default:
		rb, err := newRedlock(cfg, nodes, reg, backendLog)
		if err != nil {
			return err
		}
		reg.MustRegister(rb.StateCollector())
		backend = rb
	}
	// Closed last (deferred first): the drain below and the handler's
	// release of keepalive locks run before; closing a ZooKeeper session
	// drops every lock held through it. A failure is logged: the process
	// exits anyway, but an operator should know that, say, PostgreSQL
	// connections were left closing.
	defer func() {
		if err := backend.Close(); err != nil {
			log.Warn("closing the lock backend", zap.Error(err))
		}
	}()

	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen %s: %w", cfg.Listen, err)
	}
	srvTLS, err := cfg.TLS.ServerConfig()
	if err != nil {
		_ = ln.Close()
		return fmt.Errorf("tls: %w", err)
	}
	port := 0
	if ta, ok := ln.Addr().(*net.TCPAddr); ok {
		port = ta.Port
	}
	var up *relay.Relay
	if u := cfg.Upstream; u.Address != "" {
		upTLS, err := u.TLS.ClientConfig()
		if err != nil {
			return fmt.Errorf("upstream.tls: %w", err)
		}
		up = relay.New(relay.Config{
			Addr: u.Address, Username: u.Username, Password: u.Password, PoolSize: u.PoolSize,
			DialTimeout: u.DialTimeout, ReadTimeout: u.ReadTimeout, Deny: u.DenyCommands,
			KeyPrefix: cfg.Redlock.KeyPrefix, Logger: log, TLS: upTLS,
		})
		// Closed after the client connections drained (defers run in
		// reverse): a command in flight still gets its reply.
		defer up.Close()
	}
	srv := &resp.Server{Logger: log, MaxClients: cfg.Limits.MaxClients,
		EventLoop:    cfg.Upstream.Address != "" && cfg.Upstream.EventLoop,
		AuthRequired: cfg.Auth.Password != "" || len(cfg.Auth.Users) > 0,
		AuthTimeout:  cfg.Limits.AuthTimeout,
		MaxOutput:    cfg.Limits.MaxOutputBytes, MaxOutputPubSub: cfg.Limits.MaxOutputBytesPubSub,
		// TLS connections are served on goroutines, not the event loop,
		// with the same output buffering (resp's tls_output.go): the
		// server wraps the TCP listener's connections itself.
		TLSConfig: srvTLS}
	if srv.EventLoop {
		reg.MustRegister(
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Name: "lockproxy_event_loop_clients",
				Help: "Client connections served on the event loop now.",
			}, func() float64 { on, _, _ := srv.LoopStats(); return float64(on) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{
				Name: "lockproxy_event_loop_handoffs_total",
				Help: "Client connections moved from the event loop to a goroutine of their own (a lock command, a transaction, a blocking command…).",
			}, func() float64 { _, off, _ := srv.LoopStats(); return float64(off) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{
				Name: "lockproxy_event_loop_returns_total",
				Help: "Client connections that came back to the event loop after a run of plain batches on their goroutine.",
			}, func() float64 { _, _, back := srv.LoopStats(); return float64(back) }),
		)
	}
	reg.MustRegister(
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "lockproxy_auth_timeouts_total",
			Help: "Client connections closed for not authenticating within limits.auth_timeout.",
		}, func() float64 { n, _ := srv.RefusalStats(); return float64(n) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "lockproxy_tls_handshake_failures_total",
			Help: "Client TLS handshakes that failed or timed out.",
		}, func() float64 { _, n := srv.RefusalStats(); return float64(n) }),
	)
	reg.MustRegister(certExpiry{})
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "lockproxy_client_connections",
			Help: "Client connections open now.",
		}, func() float64 { return float64(srv.Clients()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "lockproxy_client_connections_total",
			Help: "Client connections accepted.",
		}, func() float64 { n, _ := srv.ConnStats(); return float64(n) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "lockproxy_client_connections_rejected_total",
			Help: "Client connections refused because limits.max_clients were open.",
		}, func() float64 { _, n := srv.ConnStats(); return float64(n) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "lockproxy_client_output_limit_closes_total",
			Help: "Client connections closed because the replies they had not read went past limits.max_output_bytes.",
		}, func() float64 { return float64(srv.OutputLimitCloses()) }),
	)
	if up != nil {
		reg.MustRegister(
			prometheus.NewCounterFunc(prometheus.CounterOpts{
				Name: "lockproxy_upstream_dials_total",
				Help: "Connections to the upstream attempted (TCP, TLS and the handshake).",
			}, func() float64 { n, _ := up.DialStats(); return float64(n) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{
				Name: "lockproxy_upstream_dial_failures_total",
				Help: "Connections to the upstream that could not be made: while it grows, relayed commands fail with 'upstream unavailable'.",
			}, func() float64 { _, n := up.DialStats(); return float64(n) }),
		)
	}
	handler := commands.NewHandler(commands.Options{
		Backend: backend,
		Limits: commands.Limits{
			DefaultTTL: cfg.Locks.DefaultTTL, MinTTL: cfg.Locks.MinTTL, MaxTTL: cfg.Locks.MaxTTL,
			MaxWait: cfg.Locks.MaxWait, MaxKeyBytes: cfg.Limits.MaxKeyBytes, MaxTokenBytes: cfg.Limits.MaxTokenBytes,
			KeepaliveIdle: cfg.Locks.KeepaliveIdle,
			MaxKeepalive:  cfg.Locks.MaxKeepalive,
			LockDelays:    lockDelays(cfg.Locks.LockDelays()),
		},
		Info: commands.Info{
			Version: version, Commit: commit(), Backend: cfg.Backend, Nodes: nodes, Port: port,
			// Dev mode is the embedded nodes: --dev with real nodes or
			// another backend serves real locks, and says so.
			Dev:        cfg.EmbeddedNodes(),
			ConfigFile: cfg.File(),
		},
		Logger:    log,
		Registry:  reg,
		Clients:   srv.Sessions,
		LoopStats: srv.LoopStats,
		Relay:     up,

		LockPatterns: cfg.LockPatterns,
		Password:     cfg.Auth.Password,
		Users:        cfg.Auth.UserPasswords(),
		Permissions:  permissions(cfg.Auth),
		NodeKeyPrefix: func() string {
			if cfg.Backend == conf.BackendRedlock {
				return cfg.Redlock.KeyPrefix
			}
			return ""
		}(),
	})
	defer handler.Close()
	srv.Handler = handler

	// draining is set once the drain starts: /readyz then answers 503 so
	// that a load balancer stops sending new clients to an instance that
	// refuses them, while the drain still runs.
	var draining atomic.Bool
	var admin *http.Server
	if cfg.Admin != "" {
		admin, err = startAdmin(cfg.Admin, adminMux(reg, backend, cfg.AdminPprof, &draining), log)
		if err != nil {
			ln.Close()
			return err
		}
	}

	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
	log.Info("lockproxy listening", zap.String("addr", ln.Addr().String()), zap.Strings("nodes", nodes),
		zap.String("upstream", cfg.Upstream.Address),
		zap.String("admin", cfg.Admin), zap.String("version", version), zap.Bool("dev", cfg.EmbeddedNodes()))
	if cfg.Dev {
		fmt.Fprint(banner, devBanner(cfg, nodes, ln.Addr().String()))
	}

	// systemd (Type=notify): started once the listener is up.
	if _, nerr := sdnotify.Notify(sdnotify.Ready, sdnotify.Status("listening on "+ln.Addr().String())); nerr != nil {
		log.Warn("could not tell systemd lockproxy is ready", zap.Error(nerr))
	}
	systemdReady.Store(true)
	var watchdog <-chan time.Time
	every := sdnotify.WatchdogInterval()
	if every > 0 {
		t := time.NewTicker(every)
		defer t.Stop()
		watchdog = t.C
	}
	selfTLS := srvTLS != nil
wait:
	for {
		select {
		case err = <-serveErr:
			break wait
		case <-ctx.Done():
			break wait
		case <-watchdog:
			// Only a server that answers is alive: a wedged accept or
			// event loop makes systemd restart the process.
			if cerr := selfCheck(ln.Addr(), selfTLS, srv.ConnStats, every/2); cerr != nil {
				log.Warn("watchdog: lockproxy did not answer its own PING; not telling systemd it is alive", zap.Error(cerr))
				continue
			}
			_, _ = sdnotify.Notify(sdnotify.Watchdog)
		}
	}
	// Before Shutdown closes the listener: no probe may see ready while
	// new connections are refused.
	draining.Store(true)
	_, _ = sdnotify.Notify(sdnotify.Stopping, sdnotify.Status("draining connections"))
	log.Info("shutting down: draining connections")
	sctx, cancel := context.WithTimeout(context.Background(), cfg.Limits.ShutdownTimeout)
	defer cancel()
	if derr := srv.Shutdown(sctx); derr != nil {
		log.Warn("drain deadline passed; in-flight commands were canceled", zap.Error(derr))
	}
	if admin != nil {
		_ = admin.Shutdown(sctx)
	}
	if errors.Is(err, resp.ErrServerClosed) {
		err = nil
	}
	return err
}

// newRedlock makes the RedLock backend over nodes.
func newRedlock(cfg conf.Config, nodes []string, reg *prometheus.Registry, backendLog *zap.Logger) (*redisbackend.Backend, error) {
	nodeMetrics := redisbackend.NewMetrics(reg)
	rc := cfg.Redlock
	bcfg := redisbackend.Config{
		Quorum: quorum.Config{
			DriftFactor:   rc.DriftFactor,
			DriftMin:      rc.DriftMin,
			TimeoutFactor: rc.NodeTimeoutFactor,
			TimeoutMin:    rc.NodeTimeoutMin,
			TimeoutMax:    rc.NodeTimeoutMax,
		},
		RetryMin:          cfg.Locks.RetryMin,
		RetryMax:          cfg.Locks.RetryMax,
		Quarantine:        rc.Quarantine,
		MaxTTL:            cfg.Locks.MaxTTL,
		CheckInterval:     cfg.RestartCheckEvery(),
		MaxClockRateError: rc.MaxClockRateError,
		Metrics:           nodeMetrics,
		Logger:            backendLog,
	}
	nodeTLS, err := rc.TLS.ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("redlock.tls: %w", err)
	}
	for _, addr := range nodes {
		bcfg.Nodes = append(bcfg.Nodes, redisbackend.NodeConfig{
			Addr: addr, Username: rc.Username, Password: rc.Password, KeyPrefix: rc.KeyPrefix,
			PoolSize: rc.PoolSize, Workers: rc.PipelineWorkers, MaxBatch: rc.MaxBatch,
			DialTimeout: rc.DialTimeout, Timeout: rc.NodeTimeoutMax, Metrics: nodeMetrics,
			TLS: nodeTLS,
		})
	}
	return redisbackend.New(bcfg)
}

// adminMux serves /metrics, the probes and pprof. /readyz answers 503
// "draining" once draining is set, else asks the backend whether a lock
// can be granted. pprof is served to loopback peers only unless
// pprofAnywhere (admin_pprof).
func adminMux(reg *prometheus.Registry, backend backends.Backend, pprofAnywhere bool, draining *atomic.Bool) *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("/debug/pprof/", pprofGuard(pprof.Index, pprofAnywhere))
	mux.HandleFunc("/debug/pprof/profile", pprofGuard(pprof.Profile, pprofAnywhere))
	mux.HandleFunc("/debug/pprof/symbol", pprofGuard(pprof.Symbol, pprofAnywhere))
	mux.HandleFunc("/debug/pprof/trace", pprofGuard(pprof.Trace, pprofAnywhere))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		if draining.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = io.WriteString(w, "draining\n")
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), time.Second)
		defer cancel()
		if err := backend.Ready(ctx); err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = io.WriteString(w, "not ready: "+err.Error()+"\n")
			return
		}
		_, _ = io.WriteString(w, "ready\n")
	})
	return mux
}

// pprofGuard serves h to loopback peers only, unless anywhere is set: the
// admin port is often opened to a remote Prometheus, and profiles show
// code paths and heap contents while a CPU profile or trace costs the
// process as long as it runs. A reverse proxy on the same host makes
// every peer look local; it must do its own filtering.
func pprofGuard(h http.HandlerFunc, anywhere bool) http.HandlerFunc {
	if anywhere {
		return h
	}
	return func(w http.ResponseWriter, r *http.Request) {
		if !loopbackPeer(r.RemoteAddr) {
			http.Error(w, "pprof is served to loopback peers only (admin_pprof: true serves it to every peer)", http.StatusForbidden)
			return
		}
		h(w, r)
	}
}

// loopbackPeer reports whether an http.Request's RemoteAddr is a loopback
// address, an IPv4-mapped one included.
func loopbackPeer(remoteAddr string) bool {
	ap, err := netip.ParseAddrPort(remoteAddr)
	return err == nil && ap.Addr().Unmap().IsLoopback()
}

// startAdmin serves mux on addr until the returned server is shut down.
func startAdmin(addr string, mux http.Handler, log *zap.Logger) (*http.Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("admin listen %s: %w", addr, err)
	}
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := hs.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("admin server failed", zap.Error(err))
		}
	}()
	return hs, nil
}

// devBanner is what --dev prints once listening: where the locks come
// from and how to try them. It claims the embedded nodes only when they
// serve the locks (conf.EmbeddedNodes); given nodes or another backend,
// it names those, so that nobody takes real locks for throwaway ones or
// throwaway ones for real.
func devBanner(cfg conf.Config, nodes []string, addr string) string {
	var from string
	switch {
	case cfg.EmbeddedNodes():
		from = "three embedded in-process lock nodes (for trying out only)"
	case cfg.Backend == conf.BackendRedlock:
		from = "lock nodes " + strings.Join(nodes, ",")
	case cfg.Backend == conf.BackendZookeeper:
		from = "ZooKeeper servers " + strings.Join(cfg.Zookeeper.Servers, ",")
	default:
		// The DSN may hold a password: the backend's name only.
		from = cfg.Backend + " backend"
	}
	cli := "redis-cli " + redisCLIArgs(cfg, addr)
	return fmt.Sprintf("\nlockproxy %s --dev: %s.\n"+
		"Listening on %s. Try:\n\n"+
		"  %s LOCK demo PX 10000\n"+
		"  %s UNLOCK demo <token>\n\n", version, from, addr, cli, cli)
}

// redisCLIArgs are the redis-cli options that reach the listener at addr
// as cfg serves it: -h unless redis-cli's default 127.0.0.1 gets there,
// --tls for a TLS listener, --askpass when clients must AUTH (the
// password is never printed).
func redisCLIArgs(cfg conf.Config, addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	args := "-p " + port
	if ip := net.ParseIP(host); host != "127.0.0.1" && (ip == nil || !ip.IsUnspecified()) {
		args += " -h " + host
	}
	if cfg.TLS.Enabled {
		args += " --tls --cacert <CA file>"
		if cfg.TLS.ClientCAFile != "" {
			args += " --cert <client cert> --key <client key>"
		}
	}
	switch {
	case cfg.Auth.Password != "":
		args += " --askpass"
	case len(cfg.Auth.Users) > 0:
		args += " --user <user> --askpass"
	}
	return args
}

// startDevNodes starts n in-process Redis nodes for --dev.
func startDevNodes(n int) ([]*miniredis.Miniredis, error) {
	var out []*miniredis.Miniredis
	for i := 0; i < n; i++ {
		m := miniredis.NewMiniRedis()
		if err := m.StartAddr("127.0.0.1:0"); err != nil {
			for _, o := range out {
				o.Close()
			}
			return nil, fmt.Errorf("dev node %d: %w", i, err)
		}
		out = append(out, m)
	}
	return out, nil
}

// devClock makes the embedded nodes' keys expire: miniredis only moves
// TTLs when told to, so advance them by the real time that passed.
func devClock(ctx context.Context, nodes []*miniredis.Miniredis) {
	const tick = 5 * time.Millisecond
	t := time.NewTicker(tick)
	defer t.Stop()
	last := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			for _, m := range nodes {
				m.FastForward(now.Sub(last))
			}
			last = now
		}
	}
}

func lockDelays(ds []conf.LockDelay) []commands.LockDelay {
	out := make([]commands.LockDelay, len(ds))
	for i, d := range ds {
		out[i] = commands.LockDelay{Pattern: d.Pattern, Delay: d.Delay}
	}
	return out
}

// selfCheckTargets is where selfCheck dials the listener at addr, in
// order: the address itself, or for a wildcard listener (":port",
// "0.0.0.0:port", "[::]:port") loopback, 127.0.0.1 first. Go listens on a
// wildcard with one dual-stack socket, which 127.0.0.1 reaches too, while
// [::1] fails on a host with IPv6 disabled (no ::1 on lo), and a
// self-check that always fails has systemd restart lockproxy every
// WatchdogSec. [::1] is tried after it, for a host without IPv4 on lo. A
// listener on a given IPv6 address ([::1]:port) is dialed at it.
func selfCheckTargets(addr net.Addr) []string {
	ta, ok := addr.(*net.TCPAddr)
	if !ok || (len(ta.IP) > 0 && !ta.IP.IsUnspecified()) {
		return []string{addr.String()}
	}
	port := strconv.Itoa(ta.Port)
	return []string{net.JoinHostPort("127.0.0.1", port), net.JoinHostPort("::1", port)}
}

// selfCheck connects to lockproxy's own listener, for the systemd
// watchdog. In plain text it sends PING: any reply (PONG, or NOAUTH with a
// password set) means the accept loop and the serving of a connection
// work. Over TLS, where a handshake without a client certificate would
// count as a failed one under mutual TLS, it waits for the accept loop to
// take the connection (accepted grows) and closes it unspoken.
func selfCheck(addr net.Addr, overTLS bool, stats func() (accepted, rejected int64), timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	n0, r0 := stats()
	before := n0 + r0
	var c net.Conn
	var errs []error
	for _, target := range selfCheckTargets(addr) {
		left := time.Until(deadline)
		if left <= 0 { // DialTimeout takes 0 for no timeout
			break
		}
		var err error
		if c, err = net.DialTimeout("tcp", target, left); err == nil {
			break
		}
		errs = append(errs, err)
	}
	if c == nil {
		if len(errs) == 0 {
			return errors.New("self-check: no time left to connect")
		}
		return fmt.Errorf("self-check: %w", errors.Join(errs...))
	}
	defer c.Close()
	_ = c.SetDeadline(deadline)
	if overTLS {
		for {
			if n, r := stats(); n+r > before {
				return nil
			}
			if time.Now().After(deadline) {
				return errors.New("self-check: the listener did not accept a connection")
			}
			time.Sleep(time.Millisecond)
		}
	}
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return fmt.Errorf("self-check: %w", err)
	}
	var b [1]byte
	if _, err := c.Read(b[:]); err != nil {
		return fmt.Errorf("self-check: no reply to PING: %w", err)
	}
	if b[0] != '+' && b[0] != '-' {
		return fmt.Errorf("self-check: unexpected reply %q to PING", b[0])
	}
	return nil
}
