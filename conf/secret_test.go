package conf

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestSecretPrecedence: a secret given inline or as a _file key follows
// flags > env > file as one setting, for every such pair; a layer giving
// both keys is refused, even when a higher layer replaces them.
func TestSecretPrecedence(t *testing.T) {
	dir := t.TempDir()
	for name, body := range map[string]string{"a": "from-a\n", "b": "from-b\n"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	get := map[string]func(Config) string{
		"redlock":   func(c Config) string { return c.Redlock.Password },
		"zookeeper": func(c Config) string { return c.Zookeeper.Digest },
		"postgres":  func(c Config) string { return c.Postgres.DSN },
	}
	tests := []struct {
		name   string
		secret string // redlock, zookeeper or postgres
		file   string // YAML body; "" for no file
		env    []string
		args   []string
		want   string // the secret, or the error's substring when err
		err    bool
	}{
		{"redlock: file's password_file", "redlock", "redlock: {password_file: a}", nil, nil, "from-a", false},
		{"redlock: env password over file's password_file", "redlock", "redlock: {password_file: a}",
			[]string{"LOCKPROXY_REDLOCK_PASSWORD=env-pw"}, nil, "env-pw", false},
		{"redlock: env password_file over file's password", "redlock", "redlock: {password: file-pw}",
			[]string{"LOCKPROXY_REDLOCK_PASSWORD_FILE=" + b}, nil, "from-b", false},
		{"redlock: env password_file over file's password_file", "redlock", "redlock: {password_file: a}",
			[]string{"LOCKPROXY_REDLOCK_PASSWORD_FILE=" + b}, nil, "from-b", false},
		{"redlock: empty env password over file's password_file", "redlock", "redlock: {password_file: a}",
			[]string{"LOCKPROXY_REDLOCK_PASSWORD="}, nil, "", false},
		{"redlock: both in the file", "redlock", "redlock: {password: pw, password_file: a}", nil, nil,
			"redlock.password and redlock.password_file: both set in " + filepath.Join(dir, "c.yaml") + "; set only one", true},
		{"redlock: both in the env", "redlock", "",
			[]string{"LOCKPROXY_REDLOCK_PASSWORD=pw", "LOCKPROXY_REDLOCK_PASSWORD_FILE=" + a}, nil,
			"redlock.password and redlock.password_file: both set in the environment", true},

		{"zookeeper: env digest over file's digest_file", "zookeeper", "zookeeper: {digest_file: a}",
			[]string{"LOCKPROXY_ZOOKEEPER_DIGEST=u:env"}, nil, "u:env", false},
		{"zookeeper: env digest_file over file's digest", "zookeeper", "zookeeper: {digest: u:file}",
			[]string{"LOCKPROXY_ZOOKEEPER_DIGEST_FILE=" + b}, nil, "from-b", false},
		{"zookeeper: both in the file", "zookeeper", "zookeeper: {digest: u:p, digest_file: a}", nil, nil, "zookeeper.digest and zookeeper.digest_file: both set in", true},

		{"postgres: flag dsn over file's dsn_file", "postgres", "postgres: {dsn_file: a}",
			nil, []string{"--postgres-dsn", "host=flag"}, "host=flag", false},
		{"postgres: env dsn over file's dsn_file", "postgres", "postgres: {dsn_file: a}",
			[]string{"LOCKPROXY_POSTGRES_DSN=host=env"}, nil, "host=env", false},
		{"postgres: flag dsn over env dsn_file", "postgres", "",
			[]string{"LOCKPROXY_POSTGRES_DSN_FILE=" + b}, []string{"--postgres-dsn", "host=flag"}, "host=flag", false},
		{"postgres: env dsn_file over file's dsn", "postgres", "postgres: {dsn: host=file}",
			[]string{"LOCKPROXY_POSTGRES_DSN_FILE=" + b}, nil, "from-b", false},
		{"postgres: both in the env, a flag above", "postgres", "",
			[]string{"LOCKPROXY_POSTGRES_DSN=host=env", "LOCKPROXY_POSTGRES_DSN_FILE=" + a},
			[]string{"--postgres-dsn", "host=flag"}, "postgres.dsn and postgres.dsn_file: both set in the environment", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := append([]string{"--dev"}, tt.args...)
			if tt.file != "" {
				p := filepath.Join(dir, "c.yaml")
				if err := os.WriteFile(p, []byte(tt.file), 0o600); err != nil {
					t.Fatal(err)
				}
				args = append(args, p)
			}
			c, err := FromArgs(args, tt.env)
			if tt.err {
				if err == nil || !strings.Contains(err.Error(), tt.want) {
					t.Fatalf("FromArgs(%q, %q) = %v; want an error containing %q", args, tt.env, err, tt.want)
				}
				if p := problems(t, err); len(p) != 1 {
					t.Errorf("FromArgs(%q, %q) problems = %q; want the conflict once", args, tt.env, p)
				}
				return
			}
			if err != nil {
				t.Fatalf("FromArgs(%q, %q) = %v; want no error", args, tt.env, err)
			}
			if got := get[tt.secret](c); got != tt.want {
				t.Errorf("%s secret = %q; want %q", tt.secret, got, tt.want)
			}
		})
	}
}

// TestSecretTypeErrors: an ill-typed value of a secret key is reported by
// its kind only, since yaml.v3 would quote the start of the password.
func TestSecretTypeErrors(t *testing.T) {
	tests := []struct {
		name   string
		yaml   string
		secret string // must not show up in the problem
		want   string // the problem, file:line stripped
	}{
		{"user entry instead of a list", "auth: {users: alice:hunter2}", "hunter2",
			"auth.users: cannot decode !!str into []string (the value is secret and not shown)"},
		{"mapping in the user list", "auth: {users: [alice:hunter2, {bob: s3cret}]}", "s3cret",
			"auth.users: cannot decode !!seq of !!str, !!map into []string (the value is secret and not shown)"},
		{"password as a list", "redlock: {password: [hunter2]}", "hunter2",
			"redlock.password: cannot decode !!seq of !!str into string (the value is secret and not shown)"},
		{"digest as a mapping", "zookeeper: {digest: {lp: hunter2}}", "hunter2",
			"zookeeper.digest: cannot decode !!map into string (the value is secret and not shown)"},
		{"upstream password via an alias", "x: &pw [hunter2]\nupstream: {password: *pw}", "hunter2",
			"upstream.password: cannot decode !!seq of !!str into string (the value is secret and not shown)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := writeFile(t, "lockproxy.yaml", tt.yaml)
			_, err := Load(p)
			var got []string
			for _, pr := range problems(t, err) {
				if strings.Contains(pr, tt.secret) || strings.Contains(pr, tt.secret[:3]) {
					t.Errorf("problem %q shows (part of) the secret %q", pr, tt.secret)
				}
				if i := strings.LastIndex(pr, " ("+p+":"); i >= 0 {
					pr = pr[:i]
				}
				if !strings.HasPrefix(pr, "x: ") {
					got = append(got, pr)
				}
			}
			if len(got) != 1 || got[0] != tt.want {
				t.Errorf("Load problems = %q; want [%q]", got, tt.want)
			}
		})
	}
}
