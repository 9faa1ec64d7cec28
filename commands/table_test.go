package commands

import (
	"bytes"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/lockproxy/lockproxy/resp"
)

// Redis 7's command flags (COMMAND INFO), for catching typos.
var redisFlags = map[string]bool{
	"write": true, "readonly": true, "denyoom": true, "module": true, "admin": true, "pubsub": true,
	"noscript": true, "blocking": true, "loading": true, "stale": true, "skip_monitor": true,
	"skip_slowlog": true, "asking": true, "fast": true, "no_auth": true, "may_replicate": true,
	"sentinel": true, "only_sentinel": true, "no_mandatory_keys": true, "protected": true,
	"no_async_loading": true, "no_multi": true, "movablekeys": true, "allow_busy": true,
}

// Redis 7's argument types (COMMAND DOCS).
var redisArgTypes = map[string]bool{
	"key": true, "string": true, "integer": true, "double": true, "pattern": true,
	"unix-time": true, "pure-token": true, "oneof": true, "block": true,
}

var semver = regexp.MustCompile(`^\d+\.\d+\.\d+$`)

// eachCommand calls f for every table entry and every subcommand.
func eachCommand(f func(parent, c *Command)) {
	for _, n := range sortedNames() {
		c := table[n]
		f(nil, c)
		for _, sc := range sortedSubs(c) {
			f(c, sc)
		}
	}
}

func TestCommandTable(t *testing.T) {
	if len(table) == 0 {
		t.Fatal("the command table is empty")
	}
	for _, want := range []string{"lock", "unlock", "renew", "ping", "hello", "command", "info", "client"} {
		if table[want] == nil {
			t.Errorf("table has no %q", want)
		}
	}
	metrics := map[string]string{}
	eachCommand(func(parent, c *Command) {
		name := fullName(parent, c)
		t.Run(name, func(t *testing.T) {
			if c.Name == "" || c.Name != strings.ToLower(c.Name) {
				t.Errorf("name %q; want non-empty lower case", c.Name)
			}
			if len(c.Name) > 32 {
				t.Errorf("name %q is longer than lookup's 32-byte buffer", c.Name)
			}
			if parent == nil && table[c.Name] != c || parent != nil && parent.Subs[c.Name] != c {
				t.Errorf("registered under another name than %q", c.Name)
			}
			if c.Summary == "" || c.Group == "" || c.Complexity == "" {
				t.Errorf("summary %q, group %q, complexity %q; want all set", c.Summary, c.Group, c.Complexity)
			}
			if !semver.MatchString(c.Since) {
				t.Errorf("since %q; want x.y.z", c.Since)
			}
			if c.run == nil && len(c.Subs) == 0 {
				t.Errorf("neither a handler nor subcommands")
			}
			if parent != nil && c.run == nil {
				t.Errorf("subcommand without a handler")
			}
			switch {
			case c.Arity == 0:
				t.Errorf("arity 0")
			case parent != nil && c.Arity < 2 && c.Arity > -2:
				t.Errorf("arity %d; a subcommand counts its container's name too", c.Arity)
			}
			for _, f := range c.Flags {
				if !redisFlags[f] {
					t.Errorf("flag %q is not one of Redis's", f)
				}
			}
			for _, cat := range c.Categories {
				if !strings.HasPrefix(cat, "@") {
					t.Errorf("category %q; want @name", cat)
				}
			}
			if c.Group == groupLock && !hasCategory(c, "@lock") {
				t.Errorf("lock command without the @lock category (help @lock)")
			}
			if c.FirstKey > 0 {
				if c.Step < 1 || c.LastKey >= 0 && c.LastKey < c.FirstKey {
					t.Errorf("keys first %d, last %d, step %d; want step ≥ 1, last ≥ first or negative", c.FirstKey, c.LastKey, c.Step)
				}
			} else if c.FirstKey != 0 || c.LastKey != 0 || c.Step != 0 {
				t.Errorf("keys first %d, last %d, step %d; want all 0 for a keyless command", c.FirstKey, c.LastKey, c.Step)
			}
			checkArgs(t, c, c.Args)
			if c.Metric == "" {
				t.Errorf("no metric label")
			} else if other, dup := metrics[c.Metric]; dup {
				t.Errorf("metric label %q is also %s's", c.Metric, other)
			}
			metrics[c.Metric] = name
		})
	})
}

func hasCategory(c *Command, cat string) bool {
	for _, x := range c.Categories {
		if x == cat {
			return true
		}
	}
	return false
}

func checkArgs(t *testing.T, c *Command, args []Arg) {
	t.Helper()
	for _, a := range args {
		if a.Name == "" {
			t.Errorf("argument without a name in %+v", args)
		}
		if !redisArgTypes[a.Type] {
			t.Errorf("argument %q: type %q is not one of Redis's", a.Name, a.Type)
		}
		switch a.Type {
		case "oneof", "block":
			if len(a.Args) == 0 {
				t.Errorf("argument %q: %s without arguments", a.Name, a.Type)
			}
		case "pure-token":
			if a.Token == "" {
				t.Errorf("argument %q: pure-token without a token", a.Name)
			}
		default:
			if len(a.Args) > 0 {
				t.Errorf("argument %q: %s with arguments", a.Name, a.Type)
			}
		}
		if a.Type == "key" && c.FirstKey == 0 {
			t.Errorf("argument %q is a key, but the command has no key positions", a.Name)
		}
		if a.Token != "" && a.Token != strings.ToUpper(a.Token) {
			t.Errorf("argument %q: token %q; want upper case", a.Name, a.Token)
		}
		checkArgs(t, c, a.Args)
	}
}

func TestLookup(t *testing.T) {
	for _, tc := range []struct {
		name string
		want *Command
	}{
		{"lock", table["lock"]},
		{"LOCK", table["lock"]},
		{"UnLock", table["unlock"]},
		{"COMMAND", table["command"]},
		{"nosuch", nil},
		{"", nil},
		{"lock ", nil},
		{strings.Repeat("L", 33), nil},
		{"LOCK" + strings.Repeat("\x00", 40), nil},
	} {
		if got := lookup([]byte(tc.name)); got != tc.want {
			t.Errorf("lookup(%q) = %v; want %v", tc.name, got, tc.want)
		}
	}
	name := []byte("UnLock")
	if allocs := testing.AllocsPerRun(100, func() { _ = lookup(name) }); allocs != 0 {
		t.Errorf("lookup allocates %v times; want 0", allocs)
	}
}

func TestArityOK(t *testing.T) {
	for _, tc := range []struct {
		arity, n int
		want     bool
	}{
		{2, 2, true}, {2, 1, false}, {2, 3, false},
		{-2, 1, false}, {-2, 2, true}, {-2, 9, true},
		{-1, 1, true}, {5, 5, true}, {5, 4, false},
	} {
		if got := arityOK(tc.arity, tc.n); got != tc.want {
			t.Errorf("arityOK(%d, %d) = %v; want %v", tc.arity, tc.n, got, tc.want)
		}
	}
}

// TestWriteDocAndInfo writes every entry's COMMAND DOCS and COMMAND INFO
// reply in both protocols and checks each is one well-formed RESP value of
// Redis's shape.
func TestWriteDocAndInfo(t *testing.T) {
	eachCommand(func(parent, c *Command) {
		for _, proto := range []int{2, 3} {
			t.Run(fmt.Sprintf("%s/RESP%d", fullName(parent, c), proto), func(t *testing.T) {
				w := resp.NewWriter()
				w.SetProto(proto)
				writeDoc(w, c)
				v := parseOne(t, w.Bytes(), proto)
				checkDoc(t, v, c, proto)

				w.Reset()
				writeInfo(w, parent, c)
				v = parseOne(t, w.Bytes(), proto)
				checkInfo(t, v, parent, c, proto)
			})
		}
	})
}

// TestCommandReplies runs COMMAND and its subcommands through the
// dispatcher, as redis-cli does at start, and parses the replies.
func TestCommandReplies(t *testing.T) {
	h := NewHandler(Options{Limits: testLimits})
	defer h.Close()
	for _, proto := range []int{2, 3} {
		for _, tc := range []struct {
			line  string
			check func(t *testing.T, v value)
		}{
			{"COMMAND DOCS", func(t *testing.T, v value) {
				m := asMap(t, v, proto)
				if len(m) != len(table) {
					t.Errorf("COMMAND DOCS has %d entries; want %d", len(m), len(table))
				}
				for name, doc := range m {
					if c := table[name]; c == nil {
						t.Errorf("COMMAND DOCS has %q, which is not in the table", name)
					} else {
						checkDoc(t, doc, c, proto)
					}
				}
			}},
			{"command docs LOCK client|setname nosuch", func(t *testing.T, v value) {
				m := asMap(t, v, proto)
				if len(m) != 2 || m["lock"].typ == 0 || m["client|setname"].typ == 0 {
					t.Errorf("COMMAND DOCS lock client|setname nosuch = %v; want lock and client|setname", keys(m))
				}
			}},
			{"COMMAND", func(t *testing.T, v value) {
				if v.typ != '*' || len(v.elems) != len(table) {
					t.Fatalf("COMMAND = %c with %d elements; want an array of %d", v.typ, len(v.elems), len(table))
				}
				for i, n := range sortedNames() {
					checkInfo(t, v.elems[i], nil, table[n], proto)
				}
			}},
			{"COMMAND INFO lock CLIENT|SETNAME nosuch", func(t *testing.T, v value) {
				if v.typ != '*' || len(v.elems) != 3 {
					t.Fatalf("COMMAND INFO = %c with %d elements; want an array of 3", v.typ, len(v.elems))
				}
				checkInfo(t, v.elems[0], nil, table["lock"], proto)
				checkInfo(t, v.elems[1], table["client"], table["client"].Subs["setname"], proto)
				if !v.elems[2].null {
					t.Errorf("COMMAND INFO nosuch = %+v; want a null", v.elems[2])
				}
			}},
			{"COMMAND COUNT", func(t *testing.T, v value) {
				if v.typ != ':' || v.str != strconv.Itoa(len(table)) {
					t.Errorf("COMMAND COUNT = %c%s; want :%d", v.typ, v.str, len(table))
				}
			}},
			{"COMMAND LIST", func(t *testing.T, v value) {
				if v.typ != '*' || len(v.elems) != len(table) {
					t.Errorf("COMMAND LIST = %c with %d elements; want %d", v.typ, len(v.elems), len(table))
				}
			}},
			{"COMMAND GETKEYS LOCK k PX 100", func(t *testing.T, v value) {
				if v.typ != '*' || len(v.elems) != 1 || v.elems[0].str != "k" {
					t.Errorf("COMMAND GETKEYS = %+v; want [k]", v)
				}
			}},
			{"COMMAND GETKEYS PING", func(t *testing.T, v value) {
				if v.typ != '-' {
					t.Errorf("COMMAND GETKEYS PING = %+v; want an error", v)
				}
			}},
		} {
			t.Run(fmt.Sprintf("%s/RESP%d", tc.line, proto), func(t *testing.T) {
				s := &resp.Session{W: resp.NewWriter()}
				s.W.SetProto(proto)
				h.ServeRESP(s, words(tc.line))
				tc.check(t, parseOne(t, s.W.Bytes(), proto))
			})
		}
	}
}

func keys(m map[string]value) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func checkDoc(t *testing.T, v value, c *Command, proto int) {
	t.Helper()
	m := asMap(t, v, proto)
	allowed := map[string]bool{"summary": true, "since": true, "group": true, "complexity": true, "arguments": true, "subcommands": true}
	for k := range m {
		if !allowed[k] {
			t.Errorf("%s: doc field %q is not one of Redis's", c.Name, k)
		}
	}
	for k, want := range map[string]string{"summary": c.Summary, "since": c.Since, "group": c.Group, "complexity": c.Complexity} {
		if got := m[k]; got.typ != '$' || got.str != want {
			t.Errorf("%s: doc %s = %c%q; want bulk %q", c.Name, k, got.typ, got.str, want)
		}
	}
	if args, ok := m["arguments"]; ok != (len(c.Args) > 0) {
		t.Errorf("%s: arguments present %v; want %v", c.Name, ok, len(c.Args) > 0)
	} else if ok {
		checkDocArgs(t, args, c.Args, proto)
	}
	if subs, ok := m["subcommands"]; ok != (len(c.Subs) > 0) {
		t.Errorf("%s: subcommands present %v; want %v", c.Name, ok, len(c.Subs) > 0)
	} else if ok {
		sm := asMap(t, subs, proto)
		if len(sm) != len(c.Subs) {
			t.Errorf("%s: %d subcommand docs; want %d", c.Name, len(sm), len(c.Subs))
		}
		for name, sv := range sm {
			p, sub, _ := strings.Cut(name, "|")
			if p != c.Name || c.Subs[sub] == nil {
				t.Errorf("%s: subcommand doc %q; want %s|<sub>", c.Name, name, c.Name)
				continue
			}
			checkDoc(t, sv, c.Subs[sub], proto)
		}
	}
}

func checkDocArgs(t *testing.T, v value, args []Arg, proto int) {
	t.Helper()
	if v.typ != '*' || len(v.elems) != len(args) {
		t.Errorf("arguments = %c with %d elements; want an array of %d", v.typ, len(v.elems), len(args))
		return
	}
	for i, a := range args {
		m := asMap(t, v.elems[i], proto)
		if m["name"].str != a.Name || m["type"].str != a.Type {
			t.Errorf("argument %d: name %q type %q; want %q %q", i, m["name"].str, m["type"].str, a.Name, a.Type)
		}
		_, hasDisplay := m["display_text"]
		if wantDisplay := a.Type != "pure-token" && a.Type != "oneof" && a.Type != "block"; hasDisplay != wantDisplay {
			t.Errorf("argument %q: display_text present %v; want %v", a.Name, hasDisplay, wantDisplay)
		}
		if tok, ok := m["token"]; ok != (a.Token != "") || tok.str != a.Token {
			t.Errorf("argument %q: token %q; want %q", a.Name, tok.str, a.Token)
		}
		if fl, ok := m["flags"]; ok != (len(a.Flags) > 0) {
			t.Errorf("argument %q: flags present %v; want %v", a.Name, ok, len(a.Flags) > 0)
		} else if ok {
			checkSimpleSet(t, fl, a.Flags, proto)
		}
		if sub, ok := m["arguments"]; ok != (len(a.Args) > 0) {
			t.Errorf("argument %q: arguments present %v; want %v", a.Name, ok, len(a.Args) > 0)
		} else if ok {
			checkDocArgs(t, sub, a.Args, proto)
		}
	}
}

func checkSimpleSet(t *testing.T, v value, want []string, proto int) {
	t.Helper()
	setType := byte('~')
	if proto == 2 {
		setType = '*'
	}
	if v.typ != setType || len(v.elems) != len(want) {
		t.Errorf("set = %c with %d elements; want %c with %d", v.typ, len(v.elems), setType, len(want))
		return
	}
	for i, e := range v.elems {
		if e.typ != '+' || e.str != want[i] {
			t.Errorf("set element %d = %c%q; want +%q", i, e.typ, e.str, want[i])
		}
	}
}

func checkInfo(t *testing.T, v value, parent, c *Command, proto int) {
	t.Helper()
	name := fullName(parent, c)
	if v.typ != '*' || len(v.elems) != 10 {
		t.Errorf("%s: info = %c with %d elements; want an array of 10", name, v.typ, len(v.elems))
		return
	}
	e := v.elems
	if e[0].typ != '$' || e[0].str != name {
		t.Errorf("%s: info name = %c%q", name, e[0].typ, e[0].str)
	}
	for i, want := range map[int]int{1: c.Arity, 3: c.FirstKey, 4: c.LastKey, 5: c.Step} {
		if e[i].typ != ':' || e[i].str != strconv.Itoa(want) {
			t.Errorf("%s: info element %d = %c%s; want :%d", name, i, e[i].typ, e[i].str, want)
		}
	}
	checkSimpleSet(t, e[2], c.Flags, proto)
	checkSimpleSet(t, e[6], c.Categories, proto)
	if e[7].typ != '*' {
		t.Errorf("%s: tips = %c; want an array", name, e[7].typ)
	}
	switch ks := e[8]; {
	case ks.typ != '*':
		t.Errorf("%s: key specs = %c; want an array", name, ks.typ)
	case c.FirstKey > 0 && len(ks.elems) != 1, c.FirstKey == 0 && len(ks.elems) != 0:
		t.Errorf("%s: %d key specs for first key %d", name, len(ks.elems), c.FirstKey)
	case c.FirstKey > 0:
		spec := asMap(t, ks.elems[0], proto)
		bs := asMap(t, asMap(t, spec["begin_search"], proto)["spec"], proto)
		if bs["index"].str != strconv.Itoa(c.FirstKey) {
			t.Errorf("%s: begin_search index %q; want %d", name, bs["index"].str, c.FirstKey)
		}
		fk := asMap(t, spec["find_keys"], proto)
		if fk["type"].str != "range" || len(asMap(t, fk["spec"], proto)) != 3 {
			t.Errorf("%s: find_keys = %+v", name, fk)
		}
	}
	if subs := e[9]; subs.typ != '*' || len(subs.elems) != len(c.Subs) {
		t.Errorf("%s: %c with %d subcommands; want an array of %d", name, subs.typ, len(subs.elems), len(c.Subs))
	} else {
		for i, sc := range sortedSubs(c) {
			checkInfo(t, subs.elems[i], c, sc, proto)
		}
	}
}

// asMap reads a RESP3 map, or the flat key-value array RESP2 has for one.
// Keys must be unique bulk strings.
func asMap(t *testing.T, v value, proto int) map[string]value {
	t.Helper()
	want := byte('%')
	if proto == 2 {
		want = '*'
	}
	if v.typ != want || len(v.elems)%2 != 0 {
		t.Errorf("want a map (%c with pairs), got %c with %d elements", want, v.typ, len(v.elems))
		return nil
	}
	m := make(map[string]value, len(v.elems)/2)
	for i := 0; i < len(v.elems); i += 2 {
		k := v.elems[i]
		if k.typ != '$' {
			t.Errorf("map key %d is %c%q; want a bulk string", i/2, k.typ, k.str)
			continue
		}
		if _, dup := m[k.str]; dup {
			t.Errorf("map key %q twice", k.str)
		}
		m[k.str] = v.elems[i+1]
	}
	return m
}

// value is one parsed RESP value. Maps keep their pairs flat in elems.
type value struct {
	typ   byte
	str   string // simple, error, integer, bulk, verbatim, boolean text
	null  bool
	elems []value
}

// parseOne parses exactly one RESP value from b.
func parseOne(t *testing.T, b []byte, proto int) value {
	t.Helper()
	v, rest, err := parseValue(b, proto, 0)
	if err != nil {
		t.Fatalf("malformed RESP%d: %v in %q", proto, err, clipBytes(b))
	}
	if len(rest) != 0 {
		t.Fatalf("RESP%d: %d bytes after the value: %q", proto, len(rest), clipBytes(rest))
	}
	return v
}

func clipBytes(b []byte) []byte {
	if len(b) > 300 {
		return b[:300]
	}
	return b
}

func parseLine(b []byte) (string, []byte, error) {
	i := bytes.Index(b, []byte("\r\n"))
	if i < 0 {
		return "", nil, errors.New("unterminated line")
	}
	line := b[:i]
	if bytes.ContainsAny(line, "\r\n") {
		return "", nil, fmt.Errorf("line %q has a bare CR or LF", line)
	}
	return string(line), b[i+2:], nil
}

func parseLength(b []byte, allowNull bool) (int, []byte, error) {
	line, rest, err := parseLine(b)
	if err != nil {
		return 0, nil, err
	}
	n, err := strconv.Atoi(line)
	if err != nil || n < -1 || n == -1 && !allowNull || strconv.Itoa(n) != line {
		return 0, nil, fmt.Errorf("bad length %q", line)
	}
	return n, rest, nil
}

func parseValue(b []byte, proto, depth int) (value, []byte, error) {
	if depth > 32 {
		return value{}, nil, errors.New("nested too deep")
	}
	if len(b) == 0 {
		return value{}, nil, errors.New("truncated")
	}
	v := value{typ: b[0]}
	b = b[1:]
	resp3 := func() error {
		if proto != 3 {
			return fmt.Errorf("RESP3 type %c in RESP2", v.typ)
		}
		return nil
	}
	var err error
	switch v.typ {
	case '+', '-':
		v.str, b, err = parseLine(b)
	case ':':
		v.str, b, err = parseLine(b)
		if err == nil {
			if _, e1 := strconv.ParseInt(v.str, 10, 64); e1 != nil {
				if _, e2 := strconv.ParseUint(v.str, 10, 64); e2 != nil {
					err = fmt.Errorf("bad integer %q", v.str)
				}
			}
		}
	case '$', '=':
		if v.typ == '=' {
			if err = resp3(); err != nil {
				break
			}
		}
		var n int
		n, b, err = parseLength(b, v.typ == '$' && proto == 2)
		if err != nil {
			break
		}
		if n == -1 {
			v.null = true
			break
		}
		if len(b) < n+2 || b[n] != '\r' || b[n+1] != '\n' {
			err = fmt.Errorf("bulk of %d bytes not followed by CRLF", n)
			break
		}
		v.str, b = string(b[:n]), b[n+2:]
		if v.typ == '=' {
			if len(v.str) < 4 || v.str[3] != ':' {
				err = fmt.Errorf("verbatim %q without a format", v.str)
			}
			v.str = v.str[min(4, len(v.str)):]
		}
	case '*', '~', '>', '%':
		if v.typ != '*' {
			if err = resp3(); err != nil {
				break
			}
		}
		var n int
		n, b, err = parseLength(b, v.typ == '*' && proto == 2)
		if err != nil {
			break
		}
		if n == -1 {
			v.null = true
			break
		}
		if v.typ == '%' {
			n *= 2
		}
		for range n {
			var e value
			e, b, err = parseValue(b, proto, depth+1)
			if err != nil {
				break
			}
			v.elems = append(v.elems, e)
		}
	case '_':
		if err = resp3(); err == nil {
			var line string
			line, b, err = parseLine(b)
			if err == nil && line != "" {
				err = fmt.Errorf("null with %q", line)
			}
			v.null = true
		}
	case '#':
		if err = resp3(); err == nil {
			v.str, b, err = parseLine(b)
			if err == nil && v.str != "t" && v.str != "f" {
				err = fmt.Errorf("boolean %q", v.str)
			}
		}
	default:
		err = fmt.Errorf("unknown type byte %q", v.typ)
	}
	return v, b, err
}

// TestParser checks the test's own RESP parser on a few frames, so that its
// verdicts on the writers mean something.
func TestParser(t *testing.T) {
	for _, tc := range []struct {
		in    string
		proto int
		ok    bool
	}{
		{"+OK\r\n", 2, true},
		{"*2\r\n$1\r\na\r\n:1\r\n", 2, true},
		{"%1\r\n$1\r\na\r\n_\r\n", 3, true},
		{"*-1\r\n", 2, true},
		{"*-1\r\n", 3, false},
		{"%1\r\n$1\r\na\r\n", 3, false},        // a key without its value
		{"*2\r\n$1\r\na\r\n", 2, false},        // one element short
		{"*1\r\n$1\r\na\r\n:1\r\n", 2, false},  // one element over
		{"$3\r\nab\r\n", 2, false},             // short bulk
		{"+a\nb\r\n", 2, false},                // bare LF
		{"~1\r\n+x\r\n", 2, false},             // RESP3 in RESP2
		{"=5\r\ntxt:a\r\n", 3, true},           // verbatim
		{"=3\r\nabc\r\n", 3, false},            // verbatim without format
		{"*01\r\n+x\r\n", 2, false},            // non-canonical length
		{":12a\r\n", 2, false},                 // bad integer
		{":18446744073709551615\r\n", 2, true}, // a fence
		{"#x\r\n", 3, false},                   // bad boolean
		{"!3\r\nerr\r\n", 3, false},            // not written by lockproxy
		{"*1\r\n*1\r\n*1\r\n*0\r\n", 2, true},  // nesting
		{"%0\r\n", 2, false},                   // map in RESP2
		{">1\r\n+x\r\n", 3, true},              // push
		{"_\r\n", 2, false},                    // RESP3 null in RESP2
		{"$-1\r\n", 3, false},                  // RESP2 null bulk in RESP3
	} {
		_, rest, err := parseValue([]byte(tc.in), tc.proto, 0)
		ok := err == nil && len(rest) == 0
		if ok != tc.ok {
			t.Errorf("parse RESP%d %q: ok %v (err %v, rest %q); want %v", tc.proto, tc.in, ok, err, rest, tc.ok)
		}
	}
}
