package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/lockproxy/lockproxy/conf"
)

// TestHelpListsTheCommandLine: `lockproxy --help` (and -h, -help, help) is a
// request, not a mistake: it exits 0 with the usage on stdout and nothing
// on stderr, and the usage names every form PROTOCOL.md's "Command line"
// gives — check-config FILE, --version and --dev besides [flags]
// [config.yaml] — so that an operator finds them where they look first.
func TestHelpListsTheCommandLine(t *testing.T) {
	for _, arg := range []string{"--help", "-h", "-help", "help"} {
		t.Run(arg, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			if code := run([]string{arg}, &stdout, &stderr); code != 0 {
				t.Errorf("lockproxy %s exited %d; want 0", arg, code)
			}
			if stderr.Len() != 0 {
				t.Errorf("lockproxy %s wrote on stderr:\n%s", arg, stderr.String())
			}
			out := stdout.String()
			if strings.HasPrefix(out, "lockproxy: ") {
				t.Errorf("lockproxy %s prefixes its usage as an error:\n%s", arg, out)
			}
			for _, want := range []string{
				"lockproxy [flags] [config.yaml]",
				"lockproxy check-config FILE",
				"lockproxy --version",
				"lockproxy --dev",
				"-nodes host:port,...", // the flags are still listed
			} {
				if !strings.Contains(out, want) {
					t.Errorf("lockproxy %s usage lacks %q:\n%s", arg, want, out)
				}
			}
		})
	}
}

// TestCheckConfigExitCodes: PROTOCOL.md gives `lockproxy check-config FILE`
// two exit codes, 0 (valid) and 1 (problems, every one listed): a script
// that runs it before a deploy tests for exactly those, so a missing or
// extra FILE is a problem too — exit 1, said on stderr where check-config
// lists the others.
func TestCheckConfigExitCodes(t *testing.T) {
	for _, args := range [][]string{{}, {"a.yaml", "b.yaml"}} {
		var stdout, stderr bytes.Buffer
		if code := checkConfig(args, nil, &stdout, &stderr); code != 1 {
			t.Errorf("lockproxy check-config %q exited %d; want 1\n%s", args, code, stderr.String())
		}
		if !strings.Contains(stderr.String(), "usage: lockproxy check-config FILE") {
			t.Errorf("lockproxy check-config %q does not say how to call it; stderr:\n%s", args, stderr.String())
		}
	}
}

// TestDevBannerNamesWhereLocksComeFrom: the --dev banner claims the three
// embedded in-process nodes only when they serve the locks; with --nodes,
// or on another backend, it names those instead (and no DSN, which may
// hold a password), so that nobody takes real locks for throwaway ones.
func TestDevBannerNamesWhereLocksComeFrom(t *testing.T) {
	const embedded = "three embedded in-process lock nodes"
	tests := []struct {
		name    string
		edit    func(*conf.Config)
		nodes   []string // as serve dials them
		want    string
		notWant []string
	}{
		{"embedded", func(*conf.Config) {}, []string{"127.0.0.1:40001", "127.0.0.1:40002", "127.0.0.1:40003"},
			embedded, nil},
		{"nodes given", func(c *conf.Config) { c.Redlock.Nodes = []string{"a:6379", "b:6379", "c:6379"} },
			[]string{"a:6379", "b:6379", "c:6379"}, "lock nodes a:6379,b:6379,c:6379", []string{embedded}},
		{"zookeeper", func(c *conf.Config) {
			c.Backend, c.Zookeeper.Servers = conf.BackendZookeeper, []string{"z1:2181", "z2:2181"}
		}, nil, "ZooKeeper servers z1:2181,z2:2181", []string{embedded}},
		{"postgres", func(c *conf.Config) {
			c.Backend, c.Postgres.DSN = conf.BackendPostgres, "postgres://app:s3cret@db/locks"
		}, nil, "postgres backend", []string{embedded, "s3cret"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := conf.Default()
			c.Dev = true
			tt.edit(&c)
			got := devBanner(c, tt.nodes, "127.0.0.1:7380")
			for _, want := range []string{tt.want, "redis-cli -p 7380 LOCK demo"} {
				if !strings.Contains(got, want) {
					t.Errorf("banner lacks %q:\n%s", want, got)
				}
			}
			for _, bad := range tt.notWant {
				if strings.Contains(got, bad) {
					t.Errorf("banner has %q:\n%s", bad, got)
				}
			}
		})
	}
}

// TestVersionOnlyAsAFlag: `lockproxy --listen -v` is a listen address
// (refused), not a request for the version: before, any argument spelt
// -v, -version or --version printed the version and exited 0, whatever
// flag it was the value of. As a flag it still does, anywhere.
func TestVersionOnlyAsAFlag(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		version bool
	}{
		{[]string{"--version"}, true},
		{[]string{"--dev", "-v"}, true},
		{[]string{"--listen", "-v"}, false},
		{[]string{"--upstream", "--version"}, false},
	} {
		var stdout, stderr bytes.Buffer
		code := run(tc.args, &stdout, &stderr)
		printed := strings.HasPrefix(stdout.String(), "lockproxy ") && strings.Contains(stdout.String(), "(commit ")
		if printed != tc.version || (code == 0) != tc.version {
			t.Errorf("lockproxy %q exited %d, stdout %q, stderr %q; want the version printed: %v", tc.args, code, stdout.String(), stderr.String(), tc.version)
		}
	}
}

// TestCommitFromBuildFlags: a binary built where Go stamps no VCS
// information (GOFLAGS=-buildvcs=false, as on some build machines; test
// binaries too) reports the commit the Makefile passes, not "unknown".
func TestCommitFromBuildFlags(t *testing.T) {
	defer func(c string) { buildCommit = c }(buildCommit)
	for _, tc := range []struct{ set, want string }{
		{"", "unknown"},
		{"0123456789ab-dirty", "0123456789ab-dirty"},
	} {
		buildCommit = tc.set
		if got := commit(); got != tc.want {
			t.Errorf("commit() with buildCommit %q = %q; want %q", tc.set, got, tc.want)
		}
	}
}
