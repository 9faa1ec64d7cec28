package commands

import (
	"strings"

	"github.com/lockproxy/lockproxy/resp"
)

// helpSyntax is each subcommand's syntax line in CONTAINER HELP, as
// Redis's help writes them. The table's Args do not describe every
// argument a subcommand takes (CLIENT LIST's filters, NO-EVICT's ON|OFF),
// so the lines are written out here; TestHelpSubcommandWithoutUpstream
// checks that every subcommand of the table has one.
var helpSyntax = map[string]map[string]string{
	"client": {
		"getname":  "GETNAME",
		"id":       "ID",
		"info":     "INFO",
		"list":     "LIST [TYPE (NORMAL|MASTER|REPLICA|PUBSUB)] [ID <client-id> [<client-id> ...]]",
		"no-evict": "NO-EVICT (ON|OFF)",
		"no-touch": "NO-TOUCH (ON|OFF)",
		"setinfo":  "SETINFO <LIB-NAME|LIB-VER> <value>",
		"setname":  "SETNAME <connection-name>",
	},
	"command": {
		"count":   "COUNT",
		"docs":    "DOCS [<command-name> ...]",
		"getkeys": "GETKEYS <full-command>",
		"info":    "INFO [<command-name> ...]",
		"list":    "LIST [FILTERBY (MODULE <module-name>|ACLCAT <category>|PATTERN <pattern>)]",
	},
}

// helpExtra lists subcommands served without an upstream that are not
// in the table (with an upstream they are relayed).
var helpExtra = map[string][][2]string{
	"client": {{"UNBLOCK <client-id> [TIMEOUT|ERROR]",
		"Ends a LOCK or RLOCK … WAIT of the client of that id: nil for TIMEOUT (the default), -UNBLOCKED for ERROR."}},
}

// help answers CONTAINER HELP without an upstream as Redis's addReplyHelp
// does: an array of status lines, the usage line first, then each
// subcommand's syntax with its summary indented under it, and HELP last.
// Without it, the unknown-subcommand error's "Try CLIENT HELP." sent the
// user to a command that failed as well.
func help(s *resp.Session, c *Command) {
	subs := sortedSubs(c)
	extra := helpExtra[c.Name]
	s.W.Array(1 + 2*(len(subs)+len(extra)) + 2)
	s.W.Simple(strings.ToUpper(c.Name) + " <subcommand> [<arg> [value] [opt] ...]. Subcommands are:")
	for _, sc := range subs {
		syntax := helpSyntax[c.Name][sc.Name]
		if syntax == "" {
			syntax = strings.ToUpper(sc.Name)
		}
		s.W.Simple(syntax)
		s.W.Simple("    " + sc.Summary)
	}
	for _, e := range extra {
		s.W.Simple(e[0])
		s.W.Simple("    " + e[1])
	}
	s.W.Simple("HELP")
	s.W.Simple("    Print this help.")
}
