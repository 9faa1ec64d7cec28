package commands

import (
	"fmt"
	"sort"
	"strings"

	"github.com/lockproxy/lockproxy/resp"
)

// Arg describes one argument for COMMAND DOCS, in Redis's own terms.
type Arg struct {
	Name    string
	Type    string // key, string, integer, pure-token, oneof, block
	Token   string // the keyword before the value, if any
	Flags   []string
	Display string
	Args    []Arg // for oneof and block
}

// Command is one entry of the command table. Arity follows Redis: N means
// exactly N words including the name, -N means at least N.
type Command struct {
	Name       string // lower case
	Arity      int
	Flags      []string
	FirstKey   int
	LastKey    int
	Step       int
	Categories []string
	Group      string
	Summary    string
	Since      string
	Complexity string
	Args       []Arg
	Subs       map[string]*Command // subcommands, by lower-case name
	// Metric is the closed-set label for lockproxy_commands_total.
	Metric string

	run func(h *Handler, s *resp.Session, args [][]byte)
}

// table is every command lockproxy answers itself, by lower-case name.
var table = map[string]*Command{}

// register adds c to the table. A duplicate is a programming error.
func register(c *Command) {
	if _, dup := table[c.Name]; dup {
		panic(fmt.Sprintf("commands: %q registered twice", c.Name))
	}
	if c.Metric == "" {
		c.Metric = c.Name
	}
	table[c.Name] = c
}

// sub adds a subcommand to a container command such as CLIENT.
func (c *Command) sub(s *Command) *Command {
	if c.Subs == nil {
		c.Subs = map[string]*Command{}
	}
	if _, dup := c.Subs[s.Name]; dup {
		panic(fmt.Sprintf("commands: %s|%s registered twice", c.Name, s.Name))
	}
	if s.Metric == "" {
		s.Metric = c.Name + "_" + s.Name
	}
	c.Subs[s.Name] = s
	return c
}

// FullName is "client|setname" for a subcommand, as Redis names them.
func fullName(parent, c *Command) string {
	if parent == nil {
		return c.Name
	}
	return parent.Name + "|" + c.Name
}

// lookup finds the command for name without allocating.
func lookup(name []byte) *Command {
	var buf [32]byte
	return table[string(resp.Lower(buf[:], name))]
}

// sortedNames returns the table's names in order, for stable output.
func sortedNames() []string {
	names := make([]string, 0, len(table))
	for n := range table {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

func sortedSubs(c *Command) []*Command {
	out := make([]*Command, 0, len(c.Subs))
	for _, s := range c.Subs {
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// arityOK checks n words (name included) against Redis's arity rule.
func arityOK(arity, n int) bool {
	if arity >= 0 {
		return n == arity
	}
	return n >= -arity
}

func wrongArity(s *resp.Session, name string) {
	s.W.Error("ERR wrong number of arguments for '" + strings.ToLower(name) + "' command")
}
