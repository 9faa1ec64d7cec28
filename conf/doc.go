// Package conf owns lockproxy's configuration: the Config struct, its
// defaults, loading from a YAML file, LOCKPROXY_* environment variables and
// command-line flags, and validation whose messages name the bad key.
//
// Precedence, lowest first: Default(), the YAML file, the environment, flags.
// An environment variable is LOCKPROXY_ plus the key path upper-cased with
// "." turned into "_" (redlock.drift_factor is
// LOCKPROXY_REDLOCK_DRIFT_FACTOR); lists are comma-separated. Names come from
// the yaml tags by reflection, so a new field gets its variable for free.
//
// conf never dials or listens: it checks that addresses look like
// host:port, and its TLS helpers (ClientConfig, Handshake) work on
// connections their callers made.
//
// Caveats:
//   - Load and FromArgs report what cannot be decoded but do not call
//     Validate; Parse is FromArgs and Validate with every problem of both
//     in one *ValidationError, each under its key path, as lockproxy and
//     check-config use it.
//   - LOCKPROXY_* variables that name no key are Warnings, with the
//     closest known variable, not errors: the tests' own LOCKPROXY_SOAK,
//     LOCKPROXY_TEST_* and LOCKPROXY_PG_HOTKEY share the environment, and
//     say nothing.
//   - After loading, Redlock.Password holds the contents of
//     Redlock.PasswordFile. Log the config only through String, which
//     redacts it. A relative password_file in the YAML file is resolved
//     against the file's directory; one from env or flags against the
//     working directory.
//   - A secret that may come inline or from a file (redlock.password or
//     redlock.password_file, zookeeper.digest or zookeeper.digest_file,
//     postgres.dsn or postgres.dsn_file) follows the precedence as one
//     setting: a layer that gives either key replaces both keys of the
//     layers below it. One layer giving both is an error.
//   - Ill-typed values of secret keys are reported by their YAML kinds
//     only, never quoted.
//   - Durations need a unit ("250ms", "30s"): a bare number is an error, not
//     nanoseconds.
//   - LockPatterns are syntax-checked with path.Match; how keys are matched is
//     the commands package's business (Redis globs, where '*' also matches
//     '/', unlike path.Match).
package conf
