package conf

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"gopkg.in/yaml.v3"
)

// envPrefix starts every environment variable conf reads.
const envPrefix = "LOCKPROXY_"

// envConfig may name the config file when no flag or argument does.
const envConfig = envPrefix + "CONFIG"

// Load reads the YAML file at path over Default(). Decoding is strict: every
// unknown key, duplicate key and ill-typed value is reported in one
// *ValidationError, e.g. "redlock.nodez: unknown key (lockproxy.yaml:4)".
// Redlock.PasswordFile, if set, is read into Redlock.Password. Load does not
// call Validate.
func Load(path string) (Config, error) {
	c := Default()
	if err := decodeFile(path, &c); err != nil {
		return Config{}, err
	}
	if problems := resolveSecrets(&c, true); len(problems) > 0 {
		return Config{}, &ValidationError{Problems: problems}
	}
	return c, nil
}

// Parse is FromArgs followed by Validate: the configuration lockproxy
// runs with. Its *ValidationError lists the problems of both, so that
// check-config and a failed start name every problem at once (PROTOCOL.md:
// "every problem listed"), not only those of the first stage that found
// any. A key that could not be decoded keeps its default, which Validate
// does not report again. The Config comes back with a *ValidationError
// too, for its Warnings; with any other error it is the zero Config.
func Parse(args []string, environ []string) (Config, error) {
	c, err := FromArgs(args, environ)
	var ve *ValidationError
	if err != nil && !errors.As(err, &ve) {
		return Config{}, err
	}
	var problems []string
	if ve != nil {
		problems = append(problems, ve.Problems...)
	}
	var vv *ValidationError
	if verr := c.Validate(); errors.As(verr, &vv) {
		problems = append(problems, unreported(vv.Problems, problems)...)
	} else if verr != nil {
		return Config{}, verr
	}
	if len(problems) > 0 {
		return c, &ValidationError{Problems: problems}
	}
	return c, nil
}

// unreported drops the problems of later whose key (or an item or key
// under it) one of earlier names already: Validate's complaint about the
// default that an undecodable value left is noise next to the decoding
// problem.
func unreported(later, earlier []string) []string {
	seen := map[string]bool{}
	for _, p := range earlier {
		k, _, _ := strings.Cut(p, ": ")
		if l, ok := leafByEnv(k); ok {
			k = l.path // "LOCKPROXY_X: invalid value … for x"
		}
		seen[k] = true
	}
	var out []string
	for _, p := range later {
		k, _, _ := strings.Cut(p, ": ")
		if i := strings.IndexByte(k, '['); i >= 0 {
			k = k[:i] // "auth.users[1]" is under auth.users
		}
		if !seen[k] {
			out = append(out, p)
		}
	}
	return out
}

// FromArgs builds the config from command-line args (without the program
// name and any subcommand) and environ ("KEY=value" entries, as from
// os.Environ). Precedence: flags > LOCKPROXY_* environment > file >
// defaults. The file is given as -c FILE, --config FILE, a single positional
// argument, or LOCKPROXY_CONFIG. For -h/--help the error wraps flag.ErrHelp
// and its text is the usage. FromArgs does not call Validate (Parse does).
//
// Problems with keys (unknown or undecodable keys, bad values in the
// environment, secret files that cannot be read) are all listed in one
// *ValidationError, returned with the Config as far as it could be built,
// so that Validate can add its own. LOCKPROXY_* variables that name no
// key are not errors but Warnings (see unknownEnv).
func FromArgs(args []string, environ []string) (Config, error) {
	env := make(map[string]string)
	for _, kv := range environ {
		if k, v, ok := strings.Cut(kv, "="); ok && strings.HasPrefix(k, envPrefix) {
			env[k] = v
		}
	}

	fs, file := newFlagSet()
	positional, err := parseFlags(fs, args)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return Config{}, &helpError{usage: usage(fs)}
		}
		return Config{}, fmt.Errorf("conf: %w (see --help)", err)
	}
	fileSet := false
	fs.Visit(func(f *flag.Flag) { fileSet = fileSet || f.Name == "c" || f.Name == "config" })
	switch {
	case len(positional) > 1:
		// An address given without its flag may be a URL with a
		// password in it: quoted without.
		shown := make([]string, len(positional))
		for i, p := range positional {
			shown[i] = hidePathCredentials(p)
		}
		return Config{}, fmt.Errorf("conf: want at most one config file argument, got %q", shown)
	case len(positional) == 1 && fileSet && *file != positional[0]:
		return Config{}, fmt.Errorf("conf: config file given twice: %q (-c) and %q", hidePathCredentials(*file), hidePathCredentials(positional[0]))
	case len(positional) == 1:
		*file = positional[0]
	case !fileSet:
		*file = env[envConfig]
	}

	c := Default()
	var problems []string
	if *file != "" {
		err := decodeFile(*file, &c)
		var ve *ValidationError
		if errors.As(err, &ve) {
			problems = append(problems, ve.Problems...)
		} else if err != nil {
			return Config{}, err
		}
		problems = append(problems, secretTwice(&c, *file, func(string) bool { return true })...)
		// Absolute, as the process's working directory is not in INFO.
		// The file was read, so the working directory exists: Abs fails
		// only if it cannot be found, and then the path as given is
		// better than none.
		c.file = *file
		if abs, err := filepath.Abs(*file); err == nil {
			c.file = abs
		}
	}
	// A secret given in a layer replaces the lower layers' secret however
	// either gives it, inline or as a _file key: clear both before the
	// layer applies its own.
	inEnv := func(path string) bool {
		l, _ := leafByPath(path)
		_, ok := env[l.env]
		return ok
	}
	dropSecrets(&c, inEnv)
	problems = append(problems, applyEnv(&c, env)...)
	problems = append(problems, secretTwice(&c, "the environment", inEnv)...)
	flagged := map[string]bool{}
	fs.Visit(func(f *flag.Flag) {
		if fv, ok := f.Value.(*flagValue); ok {
			flagged[fv.spec.path] = true
		}
	})
	dropSecrets(&c, func(path string) bool { return flagged[path] })
	applyFlags(&c, fs)
	c.unknownEnv = unknownEnv(env)
	// Read even when other keys have problems, so that an unreadable
	// secret file is listed with them. A secret set both ways was reported
	// by secretTwice.
	problems = append(problems, resolveSecrets(&c, false)...)
	if len(problems) > 0 {
		return c, &ValidationError{Problems: problems}
	}
	return c, nil
}

// decodeFile decodes the YAML file name into c.
func decodeFile(name string, c *Config) error {
	data, err := os.ReadFile(name)
	if err != nil {
		// An address with a password given where the file goes (a
		// positional argument, LOCKPROXY_CONFIG): the *PathError would
		// quote it whole.
		var pe *os.PathError
		if shown := hidePathCredentials(name); shown != name && errors.As(err, &pe) {
			return fmt.Errorf("conf: config file %q: %w (an address goes in its key or flag, such as --upstream or --nodes)", shown, pe.Err)
		}
		return fmt.Errorf("conf: %w", err)
	}
	err = decode(data, name, c)
	var ve *ValidationError
	if err != nil && !errors.As(err, &ve) {
		return err
	}
	// Resolved also when some keys had problems: the files the others
	// name are still read and checked (FromArgs, Validate).
	//
	// Like Prometheus: a path in a file is relative to that file.
	if f := c.Redlock.PasswordFile; f != "" && !filepath.IsAbs(f) {
		c.Redlock.PasswordFile = filepath.Join(filepath.Dir(name), f)
	}
	if f := c.Zookeeper.DigestFile; f != "" && !filepath.IsAbs(f) {
		c.Zookeeper.DigestFile = filepath.Join(filepath.Dir(name), f)
	}
	if f := c.Postgres.DSNFile; f != "" && !filepath.IsAbs(f) {
		c.Postgres.DSNFile = filepath.Join(filepath.Dir(name), f)
	}
	c.Upstream.TLS.resolve(filepath.Dir(name))
	c.Redlock.TLS.resolve(filepath.Dir(name))
	c.TLS.resolve(filepath.Dir(name))
	return err
}

// decode decodes one YAML document over c. yaml.v3's KnownFields names
// neither the key path nor every bad key, so the node tree is walked here.
func decode(data []byte, name string, c *Config) error {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil // an empty file means all defaults
		}
		return fmt.Errorf("conf: %s: %w", name, err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		if err != nil {
			return fmt.Errorf("conf: %s: %w", name, err)
		}
		return fmt.Errorf("conf: %s:%d: only one YAML document is allowed", name, extra.Line)
	}
	root := &doc
	if root.Kind == yaml.DocumentNode {
		if len(root.Content) == 0 {
			return nil
		}
		root = root.Content[0]
	}
	d := decoder{name: name}
	d.value(root, reflect.ValueOf(c).Elem(), "")
	if len(d.problems) > 0 {
		return &ValidationError{Problems: d.problems}
	}
	return nil
}

type decoder struct {
	name     string
	problems []string
}

func (d *decoder) add(key string, line int, format string, args ...any) {
	if key == "" {
		key = "(top level)"
	}
	d.problems = append(d.problems, fmt.Sprintf("%s: %s (%s:%d)", key, fmt.Sprintf(format, args...), d.name, line))
}

// value decodes n into v, whose key path is key.
func (d *decoder) value(n *yaml.Node, v reflect.Value, key string) {
	for n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!str" && v.Type() == reflect.TypeFor[Upstream]() {
		// "upstream: host:port", the short form of upstream.address.
		v.FieldByName("Address").SetString(n.Value)
		return
	}
	if v.Kind() != reflect.Struct {
		if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null" {
			// "deny_commands:" with its items commented out keeps the
			// default, as a null section or scalar does: yaml.v3 would
			// zero a list, and an empty upstream.deny_commands relays
			// FLUSHALL. An explicit [] still empties a list.
			return
		}
		err := n.Decode(v.Addr().Interface())
		switch l, _ := leafByPath(key); {
		case err == nil:
		case l.secret:
			// yaml.v3 quotes up to 10 characters of the value, which
			// here is (part of) a password: name only the kinds.
			d.add(key, n.Line, "cannot decode %s into %s (the value is secret and not shown)", tagsOf(n), v.Type())
		default:
			d.add(key, n.Line, "%s", yamlErrorText(err, v.Type()))
		}
		return
	}
	switch {
	case n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null":
		return // "redlock:" with nothing under it keeps the defaults
	case n.Kind != yaml.MappingNode && n.Kind == yaml.ScalarNode && holdsSecret(v.Type()):
		// "auth: s3cret" is likely auth.password, "zookeeper:
		// app:s3cret" zookeeper.digest: the kind only.
		d.add(key, n.Line, "want a mapping, got %s (not shown: the section holds secrets)", n.ShortTag())
		return
	case n.Kind != yaml.MappingNode:
		d.add(key, n.Line, "want a mapping, got %s", kindName(n))
		return
	}
	// Merge keys (<<) first, so explicit keys win wherever they appear.
	for i := 0; i+1 < len(n.Content); i += 2 {
		if k := n.Content[i]; k.ShortTag() == "!!merge" {
			d.merge(n.Content[i+1], v, key)
		}
	}
	seen := make(map[string]int)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, val := n.Content[i], n.Content[i+1]
		if k.ShortTag() == "!!merge" {
			continue
		}
		path := k.Value
		if key != "" {
			path = key + "." + k.Value
		}
		if line, dup := seen[k.Value]; dup {
			d.add(path, k.Line, "duplicate key, first set on line %d", line)
			continue
		}
		seen[k.Value] = k.Line
		idx := fieldIndex(v.Type(), k.Value)
		if idx < 0 {
			d.add(path, k.Line, "unknown key")
			continue
		}
		d.value(val, v.Field(idx), path)
	}
}

// holdsSecret reports whether the struct type t has a secret key, at any
// depth.
func holdsSecret(t reflect.Type) bool {
	for i := range t.NumField() {
		f := t.Field(i)
		if f.Tag.Get("secret") == "true" || f.Type.Kind() == reflect.Struct && holdsSecret(f.Type) {
			return true
		}
	}
	return false
}

// merge applies the value of a "<<" key: a mapping or a list of them, the
// earlier ones winning.
func (d *decoder) merge(n *yaml.Node, v reflect.Value, key string) {
	for n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	if n.Kind == yaml.SequenceNode {
		for i := len(n.Content) - 1; i >= 0; i-- {
			d.merge(n.Content[i], v, key)
		}
		return
	}
	d.value(n, v, key)
}

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.SequenceNode:
		return "a list"
	case yaml.MappingNode:
		return "a mapping"
	case yaml.ScalarNode:
		// "postgres: postgres://app:pw@db/locks" is a likely slip for
		// postgres.dsn: the value is quoted without its credentials.
		return fmt.Sprintf("%s %q", n.ShortTag(), hideCredentials(n.Value))
	}
	return "something else"
}

// tagsOf names the kind of n and, for a list, of its items, by their YAML
// tags ("!!seq of !!str, !!map"), never by their values.
func tagsOf(n *yaml.Node) string {
	for n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	if n.Kind != yaml.SequenceNode || len(n.Content) == 0 {
		return n.ShortTag()
	}
	var items []string
	for _, c := range n.Content {
		for c.Kind == yaml.AliasNode {
			c = c.Alias
		}
		if t := c.ShortTag(); !slices.Contains(items, t) {
			items = append(items, t)
		}
	}
	return n.ShortTag() + " of " + strings.Join(items, ", ")
}

// yamlErrorText drops yaml.v3's "line N:" prefixes (the caller adds the
// location) and hints at the duration syntax.
func yamlErrorText(err error, t reflect.Type) string {
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		return err.Error()
	}
	msgs := make([]string, len(te.Errors))
	for i, m := range te.Errors {
		if rest, ok := strings.CutPrefix(m, "line "); ok {
			if _, after, ok := strings.Cut(rest, ": "); ok {
				m = after
			}
		}
		msgs[i] = m
	}
	s := strings.Join(msgs, "; ")
	if t == durationType {
		s += `; want a duration such as "250ms" or "30s"`
	}
	return s
}

// fieldIndex returns the index of t's field whose yaml name is name, or -1.
func fieldIndex(t reflect.Type, name string) int {
	for i := range t.NumField() {
		if n, ok := yamlName(t.Field(i)); ok && n == name {
			return i
		}
	}
	return -1
}

func yamlName(f reflect.StructField) (string, bool) {
	if !f.IsExported() {
		return "", false
	}
	name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
	switch name {
	case "-":
		return "", false
	case "":
		return strings.ToLower(f.Name), true // yaml.v3's own default
	}
	return name, true
}

// secretPairs are the secrets that may be given inline or read from a
// file, by key path.
var secretPairs = []struct{ value, file string }{
	{"redlock.password", "redlock.password_file"},
	{"zookeeper.digest", "zookeeper.digest_file"},
	{"postgres.dsn", "postgres.dsn_file"},
}

// dropSecrets clears both keys of each secret pair of which the layer about
// to be applied sets either (set reports whether it sets a key path), so
// that its value or its file wins over whatever lower layers gave. Without
// it, a password_file in the YAML file and LOCKPROXY_REDLOCK_PASSWORD would
// meet in resolveSecrets as "both set", against the precedence. Both keys
// set in the one layer are refused by secretTwice.
func dropSecrets(c *Config, set func(path string) bool) {
	v := reflect.ValueOf(c).Elem()
	for _, p := range secretPairs {
		if !set(p.value) && !set(p.file) {
			continue
		}
		for _, path := range []string{p.value, p.file} {
			l, ok := leafByPath(path)
			if !ok {
				panic("conf: secret pair names unknown key " + path)
			}
			v.FieldByIndex(l.index).SetString("")
		}
	}
}

// secretTwice lists a problem for each secret given both inline and as a
// file by the layer just applied (where names it; set reports whether it
// sets a key path), even when a higher layer will replace it: the layer
// contradicts itself, and would be used as soon as the higher layer no
// longer sets the secret. dropSecrets cleared the lower layers' keys of
// every pair the layer sets, so both set means both come from this layer.
func secretTwice(c *Config, where string, set func(path string) bool) []string {
	var problems []string
	v := reflect.ValueOf(c).Elem()
	for _, p := range secretPairs {
		if !set(p.value) && !set(p.file) {
			continue
		}
		val, _ := leafByPath(p.value)
		file, _ := leafByPath(p.file)
		if v.FieldByIndex(val.index).String() != "" && v.FieldByIndex(file.index).String() != "" {
			problems = append(problems, fmt.Sprintf("%s and %s: both set in %s; set only one", p.value, p.file, where))
		}
	}
	return problems
}

// resolveSecrets reads Redlock.PasswordFile into Redlock.Password,
// Zookeeper.DigestFile into Zookeeper.Digest and Postgres.DSNFile into
// Postgres.DSN, and returns one problem per file that cannot be read or is
// empty, under the _file key. A secret given both inline and as a file is
// a problem too when reportBoth is set; FromArgs has secretTwice say it.
func resolveSecrets(c *Config, reportBoth bool) []string {
	var problems []string
	for _, s := range []struct {
		dst  *string
		file string
		key  string
	}{
		{&c.Redlock.Password, c.Redlock.PasswordFile, "redlock.password"},
		{&c.Zookeeper.Digest, c.Zookeeper.DigestFile, "zookeeper.digest"},
		{&c.Postgres.DSN, c.Postgres.DSNFile, "postgres.dsn"},
	} {
		if p := readSecret(s.dst, s.file, s.key, reportBoth); p != "" {
			problems = append(problems, p)
		}
	}
	return problems
}

// readSecret reads file (when set) into *dst, the value of key, and
// returns the problem, or "".
func readSecret(dst *string, file, key string, reportBoth bool) string {
	switch {
	case file == "":
		return ""
	case *dst != "" && reportBoth:
		return fmt.Sprintf("%s and %s_file: both set; set only one", key, key)
	case *dst != "":
		return "" // reported by secretTwice
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return fmt.Sprintf("%s_file: %v", key, err)
	}
	// Secret files usually end in a newline that is not part of the secret.
	*dst = strings.TrimRight(string(b), "\r\n")
	if *dst == "" {
		return fmt.Sprintf("%s_file: %s is empty", key, file)
	}
	return ""
}

// leaf is one settable (non-struct) field of Config.
type leaf struct {
	path   string // yaml key path, "redlock.drift_factor"
	env    string // "LOCKPROXY_REDLOCK_DRIFT_FACTOR"
	index  []int  // for reflect.Value.FieldByIndex
	typ    reflect.Type
	secret bool // redacted by String
}

var durationType = reflect.TypeFor[time.Duration]()

// leaves lists Config's leaves in field order, from the yaml tags, so new
// fields get environment variables without further code.
var leaves = sync.OnceValue(func() []leaf {
	var out []leaf
	var walk func(t reflect.Type, path []string, index []int)
	walk = func(t reflect.Type, path []string, index []int) {
		for i := range t.NumField() {
			f := t.Field(i)
			name, ok := yamlName(f)
			if !ok {
				continue
			}
			p := append(path[:len(path):len(path)], name)
			idx := append(index[:len(index):len(index)], i)
			if f.Type.Kind() == reflect.Struct {
				walk(f.Type, p, idx)
				continue
			}
			out = append(out, leaf{
				path:   strings.Join(p, "."),
				env:    envPrefix + strings.ToUpper(strings.Join(p, "_")),
				index:  idx,
				typ:    f.Type,
				secret: f.Tag.Get("secret") == "true",
			})
		}
	}
	walk(reflect.TypeFor[Config](), nil, nil)
	return out
})

func leafByPath(path string) (leaf, bool) {
	for _, l := range leaves() {
		if l.path == path {
			return l, true
		}
	}
	return leaf{}, false
}

func leafByEnv(name string) (leaf, bool) {
	for _, l := range leaves() {
		if l.env == name {
			return l, true
		}
	}
	return leaf{}, false
}

// parseLeaf parses s as a value of type t. Lists are comma-separated when
// split is set, blanks around items and empty items dropped.
func parseLeaf(t reflect.Type, s string, split bool) (reflect.Value, error) {
	if t == durationType {
		d, err := time.ParseDuration(strings.TrimSpace(s))
		if err != nil {
			return reflect.Value{}, errors.New(`want a duration such as "250ms" or "30s"`)
		}
		return reflect.ValueOf(d), nil
	}
	switch t.Kind() {
	case reflect.String:
		return reflect.ValueOf(s).Convert(t), nil
	case reflect.Bool:
		b, err := strconv.ParseBool(strings.TrimSpace(s))
		if err != nil {
			return reflect.Value{}, errors.New("want true or false")
		}
		return reflect.ValueOf(b).Convert(t), nil
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		n, err := strconv.ParseInt(strings.TrimSpace(s), 10, t.Bits())
		if err != nil {
			return reflect.Value{}, errors.New("want an integer")
		}
		return reflect.ValueOf(n).Convert(t), nil
	case reflect.Float32, reflect.Float64:
		f, err := strconv.ParseFloat(strings.TrimSpace(s), t.Bits())
		if err != nil {
			return reflect.Value{}, errors.New("want a number")
		}
		return reflect.ValueOf(f).Convert(t), nil
	case reflect.Slice:
		if t.Elem().Kind() != reflect.String {
			break
		}
		items := []string{s}
		if split {
			items = splitList(s)
		}
		return reflect.ValueOf(items).Convert(t), nil
	}
	return reflect.Value{}, fmt.Errorf("conf: unsupported field type %v", t)
}

func splitList(s string) []string {
	items := []string{}
	for item := range strings.SplitSeq(s, ",") {
		if item = strings.TrimSpace(item); item != "" {
			items = append(items, item)
		}
	}
	return items
}

// applyEnv sets every leaf whose LOCKPROXY_* variable is in env and returns
// one problem per bad value. Unknown LOCKPROXY_* variables are left to
// unknownEnv.
func applyEnv(c *Config, env map[string]string) []string {
	var problems []string
	v := reflect.ValueOf(c).Elem()
	if raw, ok := env[envPrefix+"UPSTREAM"]; ok {
		// The short form, like "upstream: host:port" in a file;
		// LOCKPROXY_UPSTREAM_ADDRESS, applied below, wins.
		c.Upstream.Address = raw
	}
	for _, l := range leaves() {
		raw, ok := env[l.env]
		if !ok {
			continue
		}
		val, err := parseLeaf(l.typ, raw, true)
		if err != nil {
			shown := strconv.Quote(raw)
			if l.secret {
				shown = redacted
			}
			problems = append(problems, fmt.Sprintf("%s: invalid value %s for %s: %v", l.env, shown, l.path, err))
			continue
		}
		v.FieldByIndex(l.index).Set(val)
	}
	return problems
}

// envNotKeys are the LOCKPROXY_* variables that name no key but are
// read: by FromArgs, or by the tests and the Makefile, whose variables
// share the environment lockproxy starts in (test/harness, test/fault,
// backends/postgres). envNotKeyPrefixes are whole families of them.
var (
	envNotKeys = map[string]bool{
		envConfig:               true,
		envPrefix + "UPSTREAM":  true, // the short form of upstream.address
		envPrefix + "SOAK":      true, // make soak
		envPrefix + "PG_HOTKEY": true, // a measurement in backends/postgres
	}
	envNotKeyPrefixes = []string{envPrefix + "TEST_"} // LOCKPROXY_TEST_BUILDFLAGS
)

// unknownEnv returns one warning per LOCKPROXY_* variable of env that
// names no key, with the closest known variable when one is close: a
// typo (LOCKPROXY_TLS_CLIENTCA_FILE) would otherwise start lockproxy
// without the setting, such as mutual TLS, and nothing would say so. It
// is a warning rather than an error because other programs' variables
// may share the prefix. Values are never shown: they may be secrets.
func unknownEnv(env map[string]string) []string {
	var names []string
	for k := range env {
		if _, ok := leafByEnv(k); ok || envNotKeys[k] {
			continue
		}
		if slices.ContainsFunc(envNotKeyPrefixes, func(p string) bool { return strings.HasPrefix(k, p) }) {
			continue
		}
		names = append(names, k)
	}
	slices.Sort(names)
	var w []string
	for _, k := range names {
		msg := k + ": no such setting; the variable is ignored"
		if near := closestEnv(k); near != "" {
			msg += "; did you mean " + near + "?"
		}
		w = append(w, msg)
	}
	return w
}

// closestEnv is the known variable nearest to name by edit distance, when
// it is near enough to be a typo of it (a third of the name's own part at
// most), else "".
func closestEnv(name string) string {
	own := strings.TrimPrefix(name, envPrefix)
	best, bestD := "", len(own)/3+1
	candidates := []string{envConfig, envPrefix + "UPSTREAM"}
	for _, l := range leaves() {
		candidates = append(candidates, l.env)
	}
	for _, c := range candidates {
		if d := editDistance(own, strings.TrimPrefix(c, envPrefix)); d < bestD {
			best, bestD = c, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance between a and b, in bytes.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// flagSpec maps one command-line flag onto a config key.
type flagSpec struct {
	name, path, usage string
	split             bool // lists: a value may hold several comma-separated items
}

var flagSpecs = []flagSpec{
	{"listen", "listen", "`host:port` to serve the Redis protocol on", false},
	{"admin", "admin", "`host:port` for HTTP /metrics, /healthz, /readyz (\"\" disables)", false},
	{"admin-pprof", "admin_pprof", "serve /debug/pprof/ on the admin listener to every peer, not only to loopback", false},
	{"backend", "backend", "lock backend: `redlock|zookeeper|postgres`", false},
	{"nodes", "redlock.nodes", "RedLock nodes, `host:port,...` (repeatable)", true},
	{"upstream", "upstream.address", "`host:port` of the Redis that other commands are relayed to", false},
	{"zk", "zookeeper.servers", "ZooKeeper servers, `host:port,...` (repeatable)", true},
	{"postgres-dsn", "postgres.dsn", "PostgreSQL connection `string` or URL (postgres backend)", false},
	{"lock-pattern", "lock_patterns", "key `glob` served as a lock in transparent mode (repeatable)", false},
	{"dev", "dev", "run embedded in-process nodes, for trying out only", false},
	{"procs", "procs", "threads running Go code: `auto|N` (auto: one while lightly loaded)", false},
	{"log-format", "log.format", "log encoding: `json|console`", false},
	{"log-level", "log.level", "lowest log level: `debug|info|warn|error`", false},
	{"key-prefix", "redlock.key_prefix", "`prefix` of lock keys on the nodes", false},
	{"drift-factor", "redlock.drift_factor", "clock drift allowance as a `fraction` of the TTL", false},
	{"default-ttl", "locks.default_ttl", "lease when LOCK gives no PX/EX (a `duration`)", false},
	{"max-ttl", "locks.max_ttl", "longest lease a LOCK may ask for (a `duration`)", false},
}

// flagValue records a flag's raw values, checked as they are set and
// applied only after the file and environment.
type flagValue struct {
	spec flagSpec
	typ  reflect.Type
	def  string
	raws []string
}

func (f *flagValue) String() string {
	switch {
	case f == nil:
		return ""
	case len(f.raws) == 0:
		return f.def
	}
	return strings.Join(f.raws, ",")
}

func (f *flagValue) Set(s string) error {
	if _, err := parseLeaf(f.typ, s, f.spec.split); err != nil {
		return err
	}
	f.raws = append(f.raws, s)
	return nil
}

func (f *flagValue) IsBoolFlag() bool { return f.typ != nil && f.typ.Kind() == reflect.Bool }

// newFlagSet defines lockproxy's flags; file receives -c/--config.
func newFlagSet() (*flag.FlagSet, *string) {
	fs := flag.NewFlagSet("lockproxy", flag.ContinueOnError)
	fs.SetOutput(io.Discard) // errors are returned, usage is in helpError
	fs.Usage = func() {}
	def := reflect.ValueOf(Default())
	for _, s := range flagSpecs {
		l, ok := leafByPath(s.path)
		if !ok {
			panic("conf: flag --" + s.name + " names unknown key " + s.path)
		}
		fv := &flagValue{spec: s, typ: l.typ}
		switch dv := def.FieldByIndex(l.index); {
		case l.typ.Kind() == reflect.Slice:
			fv.def = strings.Join(dv.Interface().([]string), ",")
		case l.typ.Kind() == reflect.Bool:
			// no default shown for switches
		default:
			fv.def = fmt.Sprint(dv.Interface())
		}
		fs.Var(fv, s.name, s.usage)
	}
	file := new(string)
	fs.StringVar(file, "c", "", "config `file` (YAML); also a positional argument or LOCKPROXY_CONFIG")
	fs.StringVar(file, "config", "", "same as -c `file`")
	return fs, file
}

// VersionAsked tells whether args ask for the version: --version,
// -version or -v given as a flag, not as another flag's value
// ("--key-prefix -v" sets a prefix). Flags are read as Parse reads
// them, up to the first it would refuse.
func VersionAsked(args []string) bool {
	fs, _ := newFlagSet()
	var asked bool
	for _, name := range []string{"version", "v"} {
		fs.BoolVar(&asked, name, false, "")
	}
	_, _ = parseFlags(fs, args)
	return asked
}

// parseFlags parses args, allowing positional arguments between flags
// ("lockproxy lockproxy.yaml --dev"); everything after "--" is positional.
func parseFlags(fs *flag.FlagSet, args []string) ([]string, error) {
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return positional, nil
		}
		if n := len(args) - len(rest); n > 0 && args[n-1] == "--" {
			return append(positional, rest...), nil
		}
		positional = append(positional, rest[0])
		args = rest[1:]
	}
}

// applyFlags sets the keys of the flags that were given. Lists collect the
// items of every use of their flag and replace the file's or env's list.
func applyFlags(c *Config, fs *flag.FlagSet) {
	v := reflect.ValueOf(c).Elem()
	fs.Visit(func(f *flag.Flag) {
		fv, ok := f.Value.(*flagValue)
		if !ok {
			return
		}
		l, _ := leafByPath(fv.spec.path)
		field := v.FieldByIndex(l.index)
		if l.typ.Kind() == reflect.Slice {
			items := reflect.MakeSlice(l.typ, 0, len(fv.raws))
			for _, raw := range fv.raws {
				val, _ := parseLeaf(l.typ, raw, fv.spec.split) // checked by Set
				items = reflect.AppendSlice(items, val)
			}
			field.Set(items)
			return
		}
		val, _ := parseLeaf(l.typ, fv.raws[len(fv.raws)-1], fv.spec.split)
		field.Set(val)
	})
}

// helpError is returned for -h/--help: its text is the usage.
type helpError struct{ usage string }

func (e *helpError) Error() string { return e.usage }
func (e *helpError) Unwrap() error { return flag.ErrHelp }

func usage(fs *flag.FlagSet) string {
	var b strings.Builder
	// Every form PROTOCOL.md's "Command line" gives, not only the one the
	// flags belong to: --help is where an operator looks for them first.
	b.WriteString("Usage: lockproxy [flags] [config.yaml]   serve (the file also as -c FILE)\n" +
		"       lockproxy --dev                   try it out: three embedded in-process lock\n" +
		"                                         nodes when no nodes are given; never for production\n" +
		"       lockproxy check-config FILE       check FILE, opening no socket; exit 0, or 1\n" +
		"                                         with every problem listed\n" +
		"       lockproxy --version               print the version and commit\n" +
		"\nFlags (-x and --x are the same):\n")
	fs.SetOutput(&b)
	fs.PrintDefaults()
	fs.SetOutput(io.Discard)
	b.WriteString("\nEvery config key can also be set as LOCKPROXY_<KEY PATH>, for example\n" +
		"LOCKPROXY_REDLOCK_NODES=10.0.0.1:6379,10.0.0.2:6379,10.0.0.3:6379.\n" +
		"Precedence: flags > environment > file > defaults.\n")
	return b.String()
}
