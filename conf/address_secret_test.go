package conf

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestAddressCredentialsNotEchoed: Redis clients take
// redis://user:password@host:port URLs (and PostgreSQL ones
// postgres://user:password@host/db), so an operator may put one where
// lockproxy wants host:port, or where it wants a mapping. The problems and
// warnings are printed at start (to the journal) and by check-config:
// they must not show the password, whichever way it was given (flag,
// LOCKPROXY_* variable, file), and must say where it goes instead. The
// user info is hidden whole, the user name too: some clients read
// "redis://secret@host" as a password alone. A query (?password=…) is
// hidden as well.
func TestAddressCredentialsNotEchoed(t *testing.T) {
	const secret = "s3cr3t-pw"
	dir := t.TempDir()
	tests := []struct {
		name string
		args []string
		env  []string
		file string   // YAML body; "" for no file
		want []string // substrings of the problems, which must say what to do
	}{
		{"--upstream URL", []string{"--dev", "--upstream", "redis://app:" + secret + "@10.0.0.1:6379"}, nil, "",
			[]string{"upstream.address: want host:port, got a URL", "give 10.0.0.1:6379", "upstream.password"}},
		{"--nodes URL", []string{"--nodes", "redis://:" + secret + "@10.0.0.1:6379,10.0.0.2:6379,10.0.0.3:6379"}, nil, "",
			[]string{"redlock.nodes[0]: want host:port, got a URL", "redlock.password"}},
		{"--nodes the same URL twice", []string{"--nodes", "redis://:" + secret + "@10.0.0.1:6379,redis://:" + secret + "@10.0.0.1:6379,10.0.0.3:6379"}, nil, "",
			[]string{"redlock.nodes[1]: duplicate of redlock.nodes[0]"}},
		{"--zk URL", []string{"--backend", "zookeeper", "--zk", "zk://app:" + secret + "@10.0.0.1:2181"}, nil, "",
			[]string{"zookeeper.servers[0]: want host:port, got a URL", "zookeeper.digest"}},
		{"LOCKPROXY_UPSTREAM_ADDRESS URL", []string{"--dev"}, []string{"LOCKPROXY_UPSTREAM_ADDRESS=redis://:" + secret + "@10.0.0.1:6379"}, "",
			[]string{"upstream.address: want host:port, got a URL"}},
		{"LOCKPROXY_UPSTREAM URL", []string{"--dev"}, []string{"LOCKPROXY_UPSTREAM=rediss://app:" + secret + "@10.0.0.1:6379"}, "",
			[]string{"upstream.address: want host:port, got a URL", "upstream.tls"}},
		{"upstream short form in the file", []string{"--dev"}, nil, "upstream: redis://app:" + secret + "@10.0.0.1:6379\n",
			[]string{"upstream.address: want host:port, got a URL"}},
		{"upstream.address in the file", []string{"--dev"}, nil, "upstream: {address: 'redis://app:" + secret + "@10.0.0.1:6379'}\n",
			[]string{"upstream.address: want host:port, got a URL"}},
		{"user info alone is a password to some clients", []string{"--dev", "--upstream", "redis://" + secret + "@10.0.0.1:6379"}, nil, "",
			[]string{"want host:port, got a URL"}},
		{"password in the query", []string{"--dev", "--upstream", "redis://10.0.0.1:6379/0?password=" + secret}, nil, "",
			[]string{"want host:port, got a URL", "give 10.0.0.1:6379"}},
		{"URL that does not parse", []string{"--dev", "--upstream", "redis://app:" + secret + "%zz@10.0.0.1:6379"}, nil, "",
			[]string{"want host:port, got a URL"}},
		{"user:password@ without a scheme", []string{"--dev", "--upstream", "app:" + secret + "@10.0.0.1:6379"}, nil, "",
			[]string{"upstream.address: want host:port", "give 10.0.0.1:6379", "upstream.password"}},
		{"password@ without a scheme", []string{"--dev", "--upstream", secret + "@10.0.0.1:6379"}, nil, "",
			[]string{"upstream.address: want host:port", "give 10.0.0.1:6379"}},
		{"a PostgreSQL URL for the postgres mapping", []string{"--backend", "postgres"}, nil, "postgres: postgres://app:" + secret + "@db:5432/locks\n",
			[]string{"postgres: want a mapping, got !!str"}},
		{"a Redis URL for the redlock mapping", []string{"--dev"}, nil, "redlock: redis://:" + secret + "@10.0.0.1:6379\n",
			[]string{"redlock: want a mapping, got !!str"}},
		{"a URL for the admin listener", []string{"--dev", "--admin", "http://app:" + secret + "@0.0.0.0:9380"}, nil, "",
			[]string{"admin: want host:port, got a URL"}},
		{"a PostgreSQL key=value DSN for the postgres mapping", []string{"--backend", "postgres"}, nil, "postgres: host=db password=" + secret + "\n",
			[]string{"postgres: want a mapping, got !!str"}},
		{"a URL where the config file goes", []string{"--dev", "redis://:" + secret + "@10.0.0.1:6379"}, nil, "",
			[]string{"config file", "--upstream"}},
		{"a URL in LOCKPROXY_CONFIG", []string{"--dev"}, []string{"LOCKPROXY_CONFIG=redis://:" + secret + "@10.0.0.1:6379"}, "",
			[]string{"config file"}},
		{"a second positional argument", []string{"--dev", "a.yaml", "redis://:" + secret + "@10.0.0.1:6379"}, nil, "",
			[]string{"want at most one config file argument"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := tt.args
			if tt.file != "" {
				p := filepath.Join(dir, "c.yaml")
				if err := os.WriteFile(p, []byte(tt.file), 0o600); err != nil {
					t.Fatal(err)
				}
				args = append(append([]string(nil), args...), p)
			}
			cfg, err := Parse(args, tt.env)
			if err == nil {
				t.Fatalf("Parse(%q, %q) = nil; want an error for the URL", args, tt.env)
			}
			if strings.Contains(err.Error(), secret) {
				t.Errorf("Parse(%q, %q) error shows the password:\n%v", args, tt.env, err)
			}
			// lockproxy and check-config print the warnings along with
			// the problems.
			for _, w := range cfg.Warnings() {
				if strings.Contains(w, secret) {
					t.Errorf("Parse(%q, %q) warning shows the password: %s", args, tt.env, w)
				}
			}
			t.Logf("%v", err)
			for _, want := range tt.want {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("Parse(%q, %q) error lacks %q:\n%v", args, tt.env, want, err)
				}
			}
		})
	}
}

// TestConfigPathWithAtShown: a config file path may hold '@' (systemd
// instance names: /etc/lockproxy@a/), and an error about it must still
// name it: only a URL, or user info before a host:port, is taken for an
// address whose credentials are hidden.
func TestConfigPathWithAtShown(t *testing.T) {
	for _, tc := range []struct {
		path string
		want string // in the error
	}{
		{"/nonexistent/lockproxy@a/lockproxy.yaml", "/nonexistent/lockproxy@a/lockproxy.yaml"},
		{"/nonexistent/lockproxy@a:1/lockproxy.yaml", "/nonexistent/lockproxy@a:1/lockproxy.yaml"},
		{"app:pw@10.0.0.1:6379", `"<redacted>@10.0.0.1:6379"`},
	} {
		_, err := Parse([]string{"--dev", tc.path}, nil)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Parse(--dev %q) = %v; want an error naming %s", tc.path, err, tc.want)
		}
	}
}
