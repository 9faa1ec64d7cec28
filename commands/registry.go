package commands

// The command table. Each entry carries what COMMAND, COMMAND DOCS and the
// dispatcher need; handlers are Handler methods named after the command.

const groupLock = "lock"

var (
	argKey   = Arg{Name: "key", Type: "key"}
	argToken = Arg{Name: "token", Type: "string"}
	argTTL   = Arg{Name: "expiration", Type: "oneof", Flags: []string{"optional"}, Args: []Arg{
		{Name: "milliseconds", Type: "integer", Token: "PX"},
		{Name: "seconds", Type: "integer", Token: "EX"},
	}}
	argWait      = Arg{Name: "milliseconds", Type: "integer", Token: "WAIT", Flags: []string{"optional"}}
	argTokenOpt  = Arg{Name: "token", Type: "string", Token: "TOKEN", Flags: []string{"optional"}}
	argKeepalive = Arg{Name: "keepalive", Type: "pure-token", Token: "KEEPALIVE", Flags: []string{"optional"}}
	argMaxHold   = Arg{Name: "max-hold-milliseconds", Type: "integer", Token: "MAXHOLD", Flags: []string{"optional"}}
)

func init() {
	// In Redis every command is @fast or @slow: LOCK, RLOCK and LOCKINFO
	// wait on a quorum round trip (or a queue), so they are @slow and a
	// "-@slow" rule refuses them; UNLOCK and RENEW are @fast.
	// LOCK and RLOCK are "blocking" and @blocking: with WAIT they hold the
	// connection until the lock is free. Redis marks a command that blocks
	// only with an option the same way (XREAD, for BLOCK), so "-@blocking"
	// refuses them with or without WAIT, as Redis refuses XREAD.
	register(&Command{
		Name: "lock", Arity: -2, Flags: []string{"write", "denyoom", "blocking"}, FirstKey: 1, LastKey: 1, Step: 1,
		Categories: []string{"@write", "@lock", "@slow", "@blocking"}, Group: groupLock, Since: "1.0.0",
		Summary:    "Acquires an exclusive lock from a majority of the lock nodes; replies token, validity_ms and fence, or nil when held. KEEPALIVE (implied without PX/EX) renews it while the connection is open and alive.",
		Complexity: "O(N) where N is the number of lock nodes.",
		Args:       []Arg{argKey, argTTL, argWait, argTokenOpt, argKeepalive, argMaxHold},
		run:        (*Handler).lock,
	})
	register(&Command{
		Name: "rlock", Arity: -2, Flags: []string{"write", "denyoom", "blocking"}, FirstKey: 1, LastKey: 1, Step: 1,
		Categories: []string{"@write", "@lock", "@slow", "@blocking"}, Group: groupLock, Since: "1.0.0",
		Summary:    "Acquires a shared read lock: many readers at once, none while a writer holds or waits. The write holder may take it with its own TOKEN (downgrade). Replies like LOCK.",
		Complexity: "O(N) where N is the number of lock nodes.",
		Args:       []Arg{argKey, argTTL, argWait, argTokenOpt, argKeepalive, argMaxHold},
		run:        (*Handler).rlock,
	})
	register(&Command{
		Name: "lockinfo", Arity: -2, Flags: []string{"readonly"}, FirstKey: 1, LastKey: 1, Step: 1,
		Categories: []string{"@read", "@lock", "@slow"}, Group: groupLock, Since: "1.0.0",
		Summary:    "Describes a lock as a majority of nodes sees it: mode, holders (tokens shown in full only to their holder), holds, ttl_ms, fence, waiters on this instance; nil when free.",
		Complexity: "O(N+R) where N is the number of lock nodes and R the number of readers.",
		Args:       []Arg{argKey, argTokenOpt},
		run:        (*Handler).lockinfo,
	})
	register(&Command{
		Name: "unlock", Arity: 3, Flags: []string{"write", "fast"}, FirstKey: 1, LastKey: 1, Step: 1,
		Categories: []string{"@write", "@lock", "@fast"}, Group: groupLock, Since: "1.0.0",
		Summary:    "Releases a lock held by token; replies 1 when released, 0 when not held by that token.",
		Complexity: "O(N) where N is the number of lock nodes.",
		Args:       []Arg{argKey, argToken},
		run:        (*Handler).unlock,
	})
	register(&Command{
		Name: "renew", Arity: 5, Flags: []string{"write", "fast"}, FirstKey: 1, LastKey: 1, Step: 1,
		Categories: []string{"@write", "@lock", "@fast"}, Group: groupLock, Since: "1.0.0",
		Summary:    "Extends a lock held by token to a new TTL on a majority; replies the new validity in ms, or 0 when no longer held.",
		Complexity: "O(N) where N is the number of lock nodes.",
		Args: []Arg{argKey, argToken, {Name: "expiration", Type: "oneof", Args: []Arg{
			{Name: "milliseconds", Type: "integer", Token: "PX"},
			{Name: "seconds", Type: "integer", Token: "EX"},
		}}},
		run: (*Handler).renew,
	})

	conn := func(c *Command) *Command {
		c.Group = "connection"
		if c.Categories == nil {
			c.Categories = []string{"@fast", "@connection"}
		}
		if c.Complexity == "" {
			c.Complexity = "O(1)"
		}
		return c
	}
	register(conn(&Command{Name: "ping", Arity: -1, Flags: []string{"fast"}, Since: "1.0.0",
		Summary: "Returns the server's liveliness response.",
		Args:    []Arg{{Name: "message", Type: "string", Flags: []string{"optional"}}}, run: (*Handler).ping}))
	register(conn(&Command{Name: "echo", Arity: 2, Flags: []string{"fast"}, Since: "1.0.0",
		Summary: "Returns the given string.", Args: []Arg{{Name: "message", Type: "string"}}, run: (*Handler).echo}))
	register(conn(&Command{Name: "quit", Arity: -1, Flags: []string{"fast", "noscript", "loading", "stale"}, Since: "1.0.0",
		Summary: "Closes the connection.", run: (*Handler).quit}))
	register(conn(&Command{Name: "auth", Arity: -2, Flags: []string{"noscript", "loading", "stale", "fast", "no_auth"}, Since: "1.0.0",
		Summary: "Authenticates the connection.",
		Args: []Arg{{Name: "username", Type: "string", Flags: []string{"optional"}},
			{Name: "password", Type: "string"}}, run: (*Handler).auth}))
	register(conn(&Command{Name: "select", Arity: 2, Flags: []string{"loading", "stale", "fast"}, Since: "1.0.0",
		Summary: "Changes the selected database; lockproxy serves database 0 only.",
		Args:    []Arg{{Name: "index", Type: "integer"}}, run: (*Handler).selectCmd}))
	register(conn(&Command{Name: "reset", Arity: 1, Flags: []string{"noscript", "loading", "stale", "fast", "no_auth"}, Since: "6.2.0",
		Summary: "Resets the connection: protocol, name, transaction, subscriptions and upstream state.", run: (*Handler).reset}))
	register(conn(&Command{Name: "hello", Arity: -1, Flags: []string{"noscript", "loading", "stale", "fast", "no_auth"}, Since: "6.0.0",
		Summary: "Handshakes with the server: picks RESP2 or RESP3, optionally authenticates and names the connection.",
		Args: []Arg{{Name: "arguments", Type: "block", Flags: []string{"optional"}, Args: []Arg{
			{Name: "protover", Type: "integer"},
			{Name: "auth", Type: "block", Token: "AUTH", Flags: []string{"optional"}, Args: []Arg{
				{Name: "username", Type: "string"}, {Name: "password", Type: "string"}}},
			{Name: "clientname", Type: "string", Token: "SETNAME", Flags: []string{"optional"}},
		}}}, run: (*Handler).hello}))

	// The subcommands carry Redis 7's categories, which auth.permissions
	// rules such as -@dangerous match.
	client := conn(&Command{Name: "client", Arity: -2, Since: "2.4.0", Summary: "A container for client connection commands.",
		Categories: []string{"@slow"}, Complexity: "Depends on subcommand."})
	client.
		sub(conn(&Command{Name: "id", Categories: []string{"@slow", "@connection"}, Arity: 2, Flags: []string{"noscript", "loading", "stale"}, Since: "5.0.0",
			Summary: "Returns the unique client ID of the connection.", run: (*Handler).clientID})).
		sub(conn(&Command{Name: "setname", Categories: []string{"@slow", "@connection"}, Arity: 3, Flags: []string{"noscript", "loading", "stale"}, Since: "2.6.9",
			Summary: "Sets the connection name.", Args: []Arg{{Name: "connection-name", Type: "string"}},
			run: (*Handler).clientSetName})).
		sub(conn(&Command{Name: "getname", Categories: []string{"@slow", "@connection"}, Arity: 2, Flags: []string{"noscript", "loading", "stale"}, Since: "2.6.9",
			Summary: "Returns the name of the connection.", run: (*Handler).clientGetName})).
		sub(conn(&Command{Name: "setinfo", Categories: []string{"@slow", "@connection"}, Arity: 4, Flags: []string{"noscript", "loading", "stale"}, Since: "7.2.0",
			Summary: "Sets information specific to the client or connection.",
			Args: []Arg{{Name: "attr", Type: "oneof", Args: []Arg{
				{Name: "libname", Type: "string", Token: "LIB-NAME"},
				{Name: "libver", Type: "string", Token: "LIB-VER"}}}},
			run: (*Handler).clientSetInfo})).
		sub(conn(&Command{Name: "info", Categories: []string{"@slow", "@connection"}, Arity: 2, Flags: []string{"noscript", "loading", "stale"}, Since: "6.2.0",
			Summary: "Returns information about the connection.", run: (*Handler).clientInfo})).
		sub(conn(&Command{Name: "list", Categories: []string{"@admin", "@slow", "@dangerous", "@connection"}, Arity: -2, Flags: []string{"noscript", "loading", "stale"}, Since: "2.4.0",
			Summary: "Lists open connections.", Complexity: "O(N) where N is the number of client connections.",
			run: (*Handler).clientList})).
		sub(conn(&Command{Name: "no-evict", Categories: []string{"@admin", "@slow", "@dangerous", "@connection"}, Arity: 3, Flags: []string{"noscript", "loading", "stale"}, Since: "7.0.0",
			Summary: "Accepted for compatibility; lockproxy evicts no clients.", run: (*Handler).clientNoop})).
		sub(conn(&Command{Name: "no-touch", Categories: []string{"@slow", "@connection"}, Arity: 3, Flags: []string{"noscript", "loading", "stale"}, Since: "7.2.0",
			Summary: "Accepted for compatibility.", run: (*Handler).clientNoop}))
	register(client)

	register(&Command{Name: "info", Arity: -1, Flags: []string{"loading", "stale"}, Group: "server", Since: "1.0.0",
		Categories: []string{"@slow", "@dangerous"}, Complexity: "O(1)",
		Summary: "Returns information and statistics about the server, with a lockproxy section.",
		Args:    []Arg{{Name: "section", Type: "string", Flags: []string{"optional", "multiple"}}},
		run:     (*Handler).infoCmd})

	cmd := &Command{Name: "command", Arity: -1, Flags: []string{"loading", "stale"}, Group: "server", Since: "2.8.13",
		Categories: []string{"@slow", "@connection"}, Complexity: "O(N) where N is the number of commands.",
		Summary: "Returns detailed information about all commands.", run: (*Handler).commandAll}
	srv := func(c *Command) *Command {
		c.Group, c.Categories, c.Flags = "server", []string{"@slow", "@connection"}, []string{"loading", "stale"}
		if c.Complexity == "" {
			c.Complexity = "O(N) where N is the number of commands."
		}
		return c
	}
	cmd.
		sub(srv(&Command{Name: "count", Arity: 2, Since: "2.8.13", Complexity: "O(1)",
			Summary: "Returns a count of commands.", run: (*Handler).commandCountMerged})).
		sub(srv(&Command{Name: "list", Arity: -2, Since: "7.0.0",
			Summary: "Returns a list of command names.", run: (*Handler).commandListMerged})).
		sub(srv(&Command{Name: "info", Arity: -2, Since: "2.8.13",
			Summary: "Returns information about one, multiple or all commands.",
			Args:    []Arg{{Name: "command-name", Type: "string", Flags: []string{"optional", "multiple"}}},
			run:     (*Handler).commandInfoMerged})).
		sub(srv(&Command{Name: "docs", Arity: -2, Since: "7.0.0",
			Summary: "Returns documentary information about one, multiple or all commands.",
			Args:    []Arg{{Name: "command-name", Type: "string", Flags: []string{"optional", "multiple"}}},
			run:     (*Handler).commandDocsMerged})).
		sub(srv(&Command{Name: "getkeys", Arity: -3, Since: "2.8.13",
			Summary: "Extracts the key names from an arbitrary command.",
			Args:    []Arg{{Name: "command", Type: "string"}, {Name: "arg", Type: "string", Flags: []string{"optional", "multiple"}}},
			run:     (*Handler).commandGetKeysMerged}))
	register(cmd)
}
