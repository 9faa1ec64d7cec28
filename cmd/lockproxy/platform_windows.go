package main

import "go.uber.org/zap"

// logPlatformLimits says, once at start, what lockproxy cannot do on
// Windows, so that nobody waits for a reload or a systemd state that
// never comes. Ctrl-C (os.Interrupt) and Ctrl-Break or a console close
// (delivered as SIGTERM) still start the graceful drain.
func logPlatformLimits(log *zap.Logger) {
	log.Warn("windows: no SIGHUP, so TLS certificates are not reloaded while running; no systemd notify; " +
		"no event loop (connections are served in Go's poller); Ctrl-C stops lockproxy gracefully")
}
