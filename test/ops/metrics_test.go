package ops

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"gopkg.in/yaml.v3"

	"github.com/lockproxy/lockproxy/test/harness"
)

const (
	rulesDir  = "../../deploy/prometheus"
	rulesFile = "lockproxy-alerts.yml"
	testsFile = "lockproxy-alerts.test.yml"
)

// TestAlertRules: promtool accepts the rules and their unit tests pass,
// and every metric an alert reads is one lockproxy exports.
func TestAlertRules(t *testing.T) {
	harness.RequireBinary(t, "promtool", "prometheus")
	for _, args := range [][]string{{"check", "rules", rulesFile}, {"test", "rules", testsFile}} {
		cmd := exec.Command("promtool", args...)
		cmd.Dir = rulesDir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	exported := exportedMetrics(t)
	for _, name := range alertMetrics(t) {
		if !exported[name] {
			t.Errorf("an alert reads %s, which lockproxy does not export", name)
		}
	}
}

// TestMetricsDocumented: the README's metrics table lists exactly the
// metrics lockproxy exports.
func TestMetricsDocumented(t *testing.T) {
	exported := exportedMetrics(t)
	documented := readmeMetrics(t)
	for name := range exported {
		if !documented[name] {
			t.Errorf("%s is exported but not in README's metrics table", name)
		}
	}
	for name := range documented {
		if !exported[name] {
			t.Errorf("README's metrics table lists %s, which lockproxy does not export", name)
		}
	}
}

var metricName = regexp.MustCompile(`\blockproxy_[a-z_]+`)

// alertMetrics are the metric names the alerting rules read, histogram
// series (_bucket, _sum, _count) by their family's name.
func alertMetrics(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(rulesDir + "/" + rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Groups []struct {
			Rules []struct {
				Alert string `yaml:"alert"`
				Expr  string `yaml:"expr"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, g := range doc.Groups {
		for _, r := range g.Rules {
			for _, m := range metricName.FindAllString(r.Expr, -1) {
				seen[strings.TrimSuffix(m, "_bucket")] = true
			}
		}
	}
	if len(seen) < 10 {
		t.Fatalf("only %d metrics found in the rules: %v", len(seen), seen)
	}
	out := make([]string, 0, len(seen))
	for m := range seen {
		out = append(out, m)
	}
	sort.Strings(out)
	return out
}

// readmeMetrics are the metric names in the first column of README's
// "## Metrics" table.
func readmeMetrics(t *testing.T) map[string]bool {
	t.Helper()
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	start := strings.Index(s, "\n## Metrics\n")
	if start < 0 {
		t.Fatal(`README has no "## Metrics" section`)
	}
	s = s[start+1:]
	if end := strings.Index(s[3:], "\n## "); end >= 0 {
		s = s[:end+3]
	}
	out := map[string]bool{}
	for _, line := range strings.Split(s, "\n") {
		if strings.HasPrefix(line, "| `lockproxy_") {
			name := strings.TrimPrefix(line, "| `")
			out[name[:strings.Index(name, "`")]] = true
		}
	}
	if len(out) < 10 {
		t.Fatalf("only %d metrics in README's table", len(out))
	}
	return out
}

// exportedNames caches exportedMetrics: both tests read the same set.
var exportedNames map[string]bool

// exportedMetrics are the metric families lockproxy exports, read from
// /metrics of three real instances between them using every part that has
// metrics: RedLock over real nodes (one of three down, so that node
// errors are counted) with a TLS listener, an upstream and auth; the
// ZooKeeper backend over a real ZooKeeper; the PostgreSQL backend over a
// real PostgreSQL.
func exportedMetrics(t *testing.T) map[string]bool {
	t.Helper()
	if exportedNames != nil {
		return exportedNames
	}
	names := map[string]bool{}

	nodes := harness.StartRedisN(t, 2, harness.RedisOptions{})
	up := harness.StartRedis(t, harness.RedisOptions{})
	dead := harness.RefusedAddr(t)
	ca := harness.NewTestCA(t)
	srv := ca.Server()
	in := start(t, []string{"--nodes", nodes[0].Addr + "," + nodes[1].Addr + "," + dead},
		"LOCKPROXY_UPSTREAM_ADDRESS="+up.Addr, "LOCKPROXY_AUTH_PASSWORD=pw",
		"LOCKPROXY_TLS_ENABLED=true", "LOCKPROXY_TLS_CERT_FILE="+srv.Cert, "LOCKPROXY_TLS_KEY_FILE="+srv.Key)
	c := redis.NewClient(&redis.Options{Addr: in.addr, Password: "pw", TLSConfig: ca.ClientConfig(),
		DialTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second, MaxRetries: -1})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := c.Do(ctx, "LOCK", "ops:metrics", "PX", "10000").Result(); err != nil {
		t.Fatalf("LOCK through the TLS listener: %v\n%s", err, in.proc.Output())
	}
	if err := c.Set(ctx, "ops:k", "v", 0).Err(); err != nil {
		t.Fatalf("SET through the relay: %v", err)
	}
	// The node gauges say which nodes vote: the two running, not the
	// dead one (the health checks run every second or so).
	want := []string{
		fmt.Sprintf("lockproxy_node_up{node=%q} 1", nodes[0].Addr),
		fmt.Sprintf("lockproxy_node_voting{node=%q} 1", nodes[1].Addr),
		fmt.Sprintf("lockproxy_node_up{node=%q} 0", dead),
		fmt.Sprintf("lockproxy_node_voting{node=%q} 0", dead),
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		body := scrape(t, in.admin)
		missing := ""
		for _, w := range want {
			if !strings.Contains(body, "\n"+w+"\n") {
				missing = w
			}
		}
		if missing == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/metrics has no %q after 20 s:\n%s", missing, body)
		}
		time.Sleep(200 * time.Millisecond)
	}
	addFamilies(t, names, in.admin)

	zk := harness.StartZooKeeper(t)
	zin := start(t, []string{"--backend", "zookeeper", "--zk", zk.Addr})
	addFamilies(t, names, zin.admin)

	pg := harness.StartPostgres(t)
	pin := start(t, []string{"--backend", "postgres", "--postgres-dsn", pg.DSN()})
	addFamilies(t, names, pin.admin)

	exportedNames = names
	return names
}

type instance struct {
	addr, admin string
	proc        *harness.Proc
}

func start(t *testing.T, args []string, env ...string) *instance {
	t.Helper()
	in := &instance{
		addr:  fmt.Sprintf("127.0.0.1:%d", harness.FreePort(t)),
		admin: fmt.Sprintf("127.0.0.1:%d", harness.FreePort(t)),
	}
	cmd := exec.Command(harness.BuildLockproxy(t), append([]string{"--listen", in.addr, "--admin", in.admin}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	in.proc = harness.StartCmd(t, cmd)
	if err := harness.WaitTCP(in.admin, 60*time.Second); err != nil {
		t.Fatalf("lockproxy %v: no admin port %s: %v\noutput:\n%s", args, in.admin, err, in.proc.Output())
	}
	if err := harness.WaitTCP(in.addr, 60*time.Second); err != nil {
		t.Fatalf("lockproxy %v: no listener %s: %v\noutput:\n%s", args, in.addr, err, in.proc.Output())
	}
	return in
}

// addFamilies adds the lockproxy_* families of admin's /metrics to names.
func addFamilies(t *testing.T, names map[string]bool, admin string) {
	t.Helper()
	for _, line := range strings.Split(scrape(t, admin), "\n") {
		if f := strings.Fields(line); len(f) >= 3 && f[0] == "#" && f[1] == "TYPE" && strings.HasPrefix(f[2], "lockproxy_") {
			names[f[2]] = true
		}
	}
}

// scrape is admin's /metrics.
func scrape(t *testing.T, admin string) string {
	t.Helper()
	hc := &http.Client{Timeout: 10 * time.Second}
	resp, err := hc.Get("http://" + admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	if err != nil {
		t.Fatal(err)
	}
	return string(body)
}

// TestDashboard: every query of the Grafana dashboard is valid PromQL
// (promtool checks it as a recording rule, Grafana's variables filled in)
// and reads only metrics lockproxy exports.
func TestDashboard(t *testing.T) {
	harness.RequireBinary(t, "promtool", "prometheus")
	b, err := os.ReadFile("../../deploy/grafana/lockproxy-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("the dashboard is not JSON: %v", err)
	}
	fill := strings.NewReplacer("$__rate_interval", "5m", "$instance", ".*")
	var rules strings.Builder
	rules.WriteString("groups:\n  - name: dashboard\n    rules:\n")
	exported := exportedMetrics(t)
	n := 0
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			n++
			expr := fill.Replace(tg.Expr)
			q, _ := json.Marshal(expr) // a JSON string is a YAML string
			fmt.Fprintf(&rules, "      - record: dashboard:query_%d\n        expr: %s\n", n, q)
			for _, m := range metricName.FindAllString(expr, -1) {
				if name := strings.TrimSuffix(m, "_bucket"); !exported[name] {
					t.Errorf("panel %q reads %s, which lockproxy does not export", p.Title, name)
				}
			}
		}
	}
	if n < 10 {
		t.Fatalf("only %d queries in the dashboard", n)
	}
	path := t.TempDir() + "/dashboard-rules.yml"
	if err := os.WriteFile(path, []byte(rules.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("promtool", "check", "rules", path).CombinedOutput(); err != nil {
		t.Fatalf("promtool check rules on the dashboard's queries: %v\n%s", err, out)
	}
}
