package conf

import (
	"slices"
	"strings"
	"testing"
)

// TestDuplicateNodeSpellings: two spellings of one node are a duplicate,
// which would let the node count twice towards a quorum.
func TestDuplicateNodeSpellings(t *testing.T) {
	tests := []struct {
		name  string
		nodes []string
		want  []string // problems; nil for none
	}{
		{"same text", []string{"a:6379", "a:6379"}, []string{
			`redlock.nodes[1]: duplicate of redlock.nodes[0] (a:6379)`,
		}},
		{"leading zero in the port", []string{"127.0.0.1:6379", "127.0.0.1:06379"}, []string{
			`redlock.nodes[1]: duplicate of redlock.nodes[0]: "127.0.0.1:6379" and "127.0.0.1:06379" name the same node`,
		}},
		{"host case", []string{"Redis-A:6379", "redis-b:6379", "redis-a:6379"}, []string{
			`redlock.nodes[2]: duplicate of redlock.nodes[0]: "Redis-A:6379" and "redis-a:6379" name the same node`,
		}},
		{"IPv4-mapped IPv6", []string{"127.0.0.1:6379", "[::ffff:127.0.0.1]:6379"}, []string{
			`redlock.nodes[1]: duplicate of redlock.nodes[0]: "127.0.0.1:6379" and "[::ffff:127.0.0.1]:6379" name the same node`,
		}},
		{"IPv6 spellings", []string{"[2001:DB8::1]:6379", "[2001:db8:0:0:0:0:0:1]:6379"}, []string{
			`redlock.nodes[1]: duplicate of redlock.nodes[0]: "[2001:DB8::1]:6379" and "[2001:db8:0:0:0:0:0:1]:6379" name the same node`,
		}},
		{"third spelling names the first", []string{"10.0.0.1:6379", "10.0.0.2:6379", "10.0.0.1:6379", "[::ffff:10.0.0.1]:06379"}, []string{
			`redlock.nodes[2]: duplicate of redlock.nodes[0] (10.0.0.1:6379)`,
			`redlock.nodes[3]: duplicate of redlock.nodes[0]: "10.0.0.1:6379" and "[::ffff:10.0.0.1]:06379" name the same node`,
		}},
		{"different ports", []string{"127.0.0.1:6379", "127.0.0.1:6380", "127.0.0.1:6381"}, nil},
		{"different hosts", []string{"redis-a:6379", "redis-b:6379", "10.0.0.1:6379"}, nil},
		// A zone is an interface name: case matters.
		{"IPv6 zones", []string{"[fe80::1%eth0]:6379", "[fe80::1%ETH0]:6379", "[fe80::1%eth1]:6379"}, nil},
		// "redis-a" may be completed by a search domain; "redis-a." not.
		{"trailing dot", []string{"redis-a:6379", "redis-a.:6379", "redis-b:6379"}, nil},
		// Cannot be told apart without DNS.
		{"localhost and 127.0.0.1", []string{"localhost:6379", "127.0.0.1:6379", "redis-b:6379"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, key := range []string{"redlock.nodes", "zookeeper.servers"} {
				c := Default()
				if key == "redlock.nodes" {
					c.Redlock.Nodes = tt.nodes
				} else {
					c.Redlock.Nodes = []string{"r:6379"}
					c.Zookeeper.Servers = tt.nodes
				}
				want := make([]string, len(tt.want))
				for i, w := range tt.want {
					want[i] = strings.ReplaceAll(w, "redlock.nodes", key)
				}
				got := problems(t, c.Validate())
				if !slices.Equal(got, want) && !(len(got) == 0 && len(want) == 0) {
					t.Errorf("Validate(%s = %q) =\n%s\nwant\n%s", key, tt.nodes, strings.Join(got, "\n"), strings.Join(want, "\n"))
				}
			}
		})
	}
}

// TestAdminPprof: admin_pprof comes from the file, LOCKPROXY_ADMIN_PPROF
// or --admin-pprof, and an admin address off loopback gets a warning that
// says where pprof is served.
func TestAdminPprof(t *testing.T) {
	for _, tt := range []struct {
		name string
		args []string
		env  []string
		want bool
	}{
		{"default", nil, nil, false},
		{"flag", []string{"--admin-pprof"}, nil, true},
		{"flag false over env", []string{"--admin-pprof=false"}, []string{"LOCKPROXY_ADMIN_PPROF=true"}, false},
		{"env", nil, []string{"LOCKPROXY_ADMIN_PPROF=true"}, true},
		{"file", []string{writeFile(t, "c.yaml", "admin_pprof: true\n")}, nil, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c, err := FromArgs(append([]string{"--dev"}, tt.args...), tt.env)
			if err != nil {
				t.Fatalf("FromArgs = %v", err)
			}
			if c.AdminPprof != tt.want {
				t.Errorf("admin_pprof = %v; want %v", c.AdminPprof, tt.want)
			}
		})
	}

	for _, tt := range []struct {
		admin string
		pprof bool
		want  string // substring of the one warning; "" for none
	}{
		{"127.0.0.1:9380", false, ""},
		{"127.0.0.1:9380", true, ""},
		{"localhost:9380", false, ""},
		{"[::1]:9380", false, ""},
		{"[::ffff:127.0.0.1]:9380", false, ""},
		{"", false, ""},
		{":9380", false, "/debug/pprof/ is served to loopback peers only"},
		{"0.0.0.0:9380", false, "/debug/pprof/ is served to loopback peers only"},
		{"10.0.0.5:9380", false, "/debug/pprof/ is served to loopback peers only"},
		{"admin.example:9380", false, "/debug/pprof/ is served to loopback peers only"},
		{"0.0.0.0:9380", true, "admin_pprof: /debug/pprof/ is served to every peer"},
	} {
		c := Default()
		c.Redlock.Nodes = []string{"a:1", "b:1", "c:1"}
		c.Admin, c.AdminPprof = tt.admin, tt.pprof
		w := c.Warnings()
		switch {
		case tt.want == "" && len(w) != 0:
			t.Errorf("admin %q, admin_pprof %v: Warnings() = %q; want none", tt.admin, tt.pprof, w)
		case tt.want != "" && (len(w) != 1 || !strings.Contains(w[0], tt.want)):
			t.Errorf("admin %q, admin_pprof %v: Warnings() = %q; want one containing %q", tt.admin, tt.pprof, w, tt.want)
		}
	}
}
