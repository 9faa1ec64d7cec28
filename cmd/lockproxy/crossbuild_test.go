package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// TestCrossBuild: the binary builds for the platforms lockproxy does not
// test on but people run it on (`--dev` on a Windows or macOS laptop, a
// FreeBSD server), so that a Linux-only call added to shared code fails
// CI here rather than a user's `go install`. Only the build is checked:
// the tests themselves run on Linux.
func TestCrossBuild(t *testing.T) {
	if testing.Short() {
		t.Skip("cross-compiles the binary twice: not in -short")
	}
	gotool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go tool on PATH:", err)
	}
	// A cold build cache on a loaded machine needs minutes per target;
	// past that the build is stuck, not slow.
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	dir := t.TempDir()
	for _, tc := range []struct{ goos, goarch, ext string }{
		// Windows, the one not unix; macOS, the unix laptops run. The
		// BSDs share macOS's side of every build constraint lockproxy
		// has; a target more would cost CI a cold build of it.
		{"windows", "amd64", ".exe"},
		{"darwin", "arm64", ""},
	} {
		t.Run(tc.goos+"/"+tc.goarch, func(t *testing.T) {
			out := filepath.Join(dir, "lockproxy-"+tc.goos+"-"+tc.goarch+tc.ext)
			cmd := exec.CommandContext(ctx, gotool, "build", "-o", out, ".")
			cmd.Env = append(os.Environ(), "GOOS="+tc.goos, "GOARCH="+tc.goarch, "CGO_ENABLED=0")
			if b, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("GOOS=%s GOARCH=%s go build ./cmd/lockproxy: %v\n%s", tc.goos, tc.goarch, err, b)
			}
			if fi, err := os.Stat(out); err != nil || fi.Size() == 0 {
				t.Fatalf("no binary at %s: %v", out, err)
			}
		})
	}
}
