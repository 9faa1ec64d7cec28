package postgres

import (
	"crypto/md5"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"regexp"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
)

// identRE is what schema names and table prefixes may be: lower-case SQL
// identifiers that need no quoting, so what an operator types in psql
// names the same tables.
var identRE = regexp.MustCompile(`^[a-z_][a-z0-9_]*$`)

// maxPrefix leaves room under PostgreSQL's 63-byte identifiers for the
// longest suffix ("waiting_writers") and the index names.
const maxPrefix = 40

// ValidIdent reports whether s may be a schema name (prefix false) or a
// table prefix (prefix true, which may be empty).
func ValidIdent(s string, prefix bool) bool {
	if prefix {
		return s == "" || (len(s) <= maxPrefix && identRE.MatchString(s))
	}
	return len(s) <= 63 && identRE.MatchString(s)
}

// names are the quoted, schema-qualified names of the backend's objects
// and the statements over them.
type names struct {
	holds, waiters, fences string // schema.prefixholds, …
	// holdsKey and waitersKey are the tables' unique indexes, qualified
	// (for to_regclass); holdsKeyIdent and waitersKeyIdent the same names
	// unqualified, as CREATE INDEX takes them.
	holdsKey, waitersKey           string
	holdsKeyIdent, waitersKeyIdent string
	channel                        string // NOTIFY channel, unqualified
	channelIdent                   string // the channel quoted for LISTEN
}

func newNames(schema, prefix string) names {
	q := func(name string) string { return pgx.Identifier{schema, prefix + name}.Sanitize() }
	ch := prefix + "released"
	return names{
		holds:           q("holds"),
		waiters:         q("waiting_writers"),
		fences:          q("fence"),
		holdsKey:        q("holds_key"),
		waitersKey:      q("waiting_writers_key"),
		holdsKeyIdent:   pgx.Identifier{prefix + "holds_key"}.Sanitize(),
		waitersKeyIdent: pgx.Identifier{prefix + "waiting_writers_key"}.Sanitize(),
		channel:         ch,
		channelIdent:    pgx.Identifier{ch}.Sanitize(),
	}
}

// digest is the SQL of the SHA-256 of the bytes of text expression e (in
// the database's encoding). Keys and tokens are indexed by it, not as they
// are: a B-tree entry holds at most about 2,700 bytes, and keys may be
// up to limits.max_key_bytes (64 KiB by default, a third more once
// base64-encoded by dbText), tokens up to limits.max_token_bytes, both
// without an upper bound. SHA-256, never md5, whose collisions can be
// made: two keys with one digest would share a unique index entry.
//
// It is built of immutable functions only, as an index expression must
// be: convert_to() and textsend() are only stable, and a cast of text to
// bytea reads backslash escapes. decode(…, 'escape') turns a doubled
// backslash into one and takes every other byte as it is, so doubling the
// backslashes first gives back e's bytes exactly. The literals are E'…'
// strings, read the same whatever standard_conforming_strings says, and
// the functions are qualified so that the statements' expressions are the
// index's (ON CONFLICT and the planner match them) whatever the
// search_path.
func digest(e string) string {
	return `pg_catalog.sha256(pg_catalog.decode(pg_catalog.replace(` + e + `, E'\\', E'\\\\'), 'escape'))`
}

// keyIs is the condition that column col (key, or h.key) is key $1: by
// the digest, so that the unique index finds the rows, and by the key
// itself, so that two keys never share rows.
func keyIs(col string) string {
	return digest(col) + ` = ` + digest(`$1`) + ` AND ` + col + ` = $1`
}

// schemaSQL creates what is missing, in order. One row per holder and
// mode: a downgraded token has a write row and a read row. mode is
// backends.Mode (0 write, 1 read), so ORDER BY mode puts write holds
// first, as UNLOCK releases them. The primary keys are not (key, token,
// mode) and (key, waiter), which would put whole keys in a B-tree: the
// unique indexes on the digests (see digest) are what ON CONFLICT names,
// and the statements find a key's rows through them (keyIs). Each table
// still has a primary key, a surrogate id no statement reads or writes:
// a table in a publication (logical replication, CDC) needs a replica
// identity for UPDATE and DELETE, or they fail (SQLSTATE 55000), and an
// expression index cannot be one. id comes last, where the upgrade's ADD
// COLUMN puts it, so that every table has the same columns in the same
// order. A schema made before is brought up to date by Backend.makeSchema.
func (n names) schemaSQL() []string {
	return []string{
		`CREATE SEQUENCE IF NOT EXISTS ` + n.fences + ` AS bigint`,
		`CREATE TABLE IF NOT EXISTS ` + n.holds + ` (
	key        text        NOT NULL,
	token      text        NOT NULL,
	mode       smallint    NOT NULL CHECK (mode IN (0, 1)),
	holds      bigint      NOT NULL CHECK (holds > 0),
	expires_at timestamptz NOT NULL,
	fence      bigint      NOT NULL,
	` + surrogateKey + `)`,
		`CREATE UNIQUE INDEX IF NOT EXISTS ` + n.holdsKeyIdent + ` ON ` + n.holds + ` (` + n.holdsConflict() + `)`,
		`CREATE INDEX IF NOT EXISTS ` + pgx.Identifier{unq(n.holds) + "_expires_at"}.Sanitize() + ` ON ` + n.holds + ` (expires_at)`,
		`CREATE TABLE IF NOT EXISTS ` + n.waiters + ` (
	key        text        NOT NULL,
	waiter     text        NOT NULL,
	expires_at timestamptz NOT NULL,
	` + surrogateKey + `)`,
		`CREATE UNIQUE INDEX IF NOT EXISTS ` + n.waitersKeyIdent + ` ON ` + n.waiters + ` (` + n.waitersConflict() + `)`,
	}
}

// holdsConflict and waitersConflict are the unique indexes' columns, as
// ON CONFLICT names them. A waiter id is 24 hex digits: it is indexed as
// it is.
func (n names) holdsConflict() string   { return digest("key") + `, ` + digest("token") + `, mode` }
func (n names) waitersConflict() string { return digest("key") + `, waiter` }

// surrogateKey is the tables' primary key column (see schemaSQL), as
// CREATE TABLE and ALTER TABLE … ADD COLUMN take it.
const surrogateKey = `id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY`

// schemaStateSQL reads, in one row, whether the tables and the sequence
// exist, whether both unique indexes do (an object of the name, whatever
// it is: checkIndexSQL says whether it fits), and whether both tables have
// their surrogate primary key (the schema before the digests had (key,
// token, mode) and (key, waiter); the first with the digests had none).
func (n names) schemaStateSQL() (string, []any) {
	return `SELECT to_regclass($1) IS NOT NULL AND to_regclass($2) IS NOT NULL AND to_regclass($3) IS NOT NULL,
	to_regclass($4) IS NOT NULL AND to_regclass($5) IS NOT NULL,
	(SELECT count(*) = 2 FROM pg_catalog.pg_constraint c JOIN pg_catalog.pg_attribute a ON a.attrelid = c.conrelid AND a.attname = 'id'
		WHERE c.contype = 'p' AND c.conrelid IN (to_regclass($1), to_regclass($2)) AND c.conkey = ARRAY[a.attnum] AND a.attidentity <> '')`,
		[]any{n.holds, n.waiters, n.fences, n.holdsKey, n.waitersKey}
}

// keysSQL reads, for each table (sanitized, $1 and $2), what its primary
// key is: the name of one that is not the surrogate key (makeSchema drops
// it), whether the surrogate key is there, whether a column id is, and
// whether that column is an identity column.
func (n names) keysSQL() (string, []any) {
	return `SELECT t.name, CASE WHEN c.conkey = ARRAY[a.attnum] AND a.attidentity <> '' THEN '' ELSE coalesce(c.conname, '') END,
	coalesce(c.conkey = ARRAY[a.attnum] AND a.attidentity <> '', false), a.attnum IS NOT NULL, coalesce(a.attidentity <> '', false)
FROM (VALUES ($1::text), ($2::text)) t(name)
LEFT JOIN pg_catalog.pg_constraint c ON c.contype = 'p' AND c.conrelid = to_regclass(t.name)
LEFT JOIN pg_catalog.pg_attribute a ON a.attrelid = to_regclass(t.name) AND a.attname = 'id' AND NOT a.attisdropped
ORDER BY 1`, []any{n.holds, n.waiters}
}

// checkIndexSQL reads what makes the unique index $1 (qualified) fit
// table $2 with $3 columns, the last one column $4 and the first
// an expression: whether $1 is an index at all, on $2, unique, valid and
// ready, immediate (ON CONFLICT takes no deferred index), not partial,
// with exactly $3 columns (no INCLUDE), the last $4 and the first an
// expression, and the first two columns' expressions as PostgreSQL prints
// them. Whether the expressions are the digests is left to the planner
// (indexArbiters, arbiterProbeSQL): it matches them as ON CONFLICT does, which printing
// them, varying with settings and versions, would not tell reliably.
func checkIndexSQL() string {
	return `SELECT i.indexrelid IS NOT NULL, coalesce(i.indrelid = to_regclass($2), false),
	coalesce(i.indisunique, false), coalesce(i.indisvalid AND i.indisready, false), coalesce(i.indimmediate, false), coalesce(i.indpred IS NULL, false),
	coalesce(i.indnatts = $3 AND i.indnkeyatts = $3 AND i.indkey[0] = 0 AND a.attname IS NOT DISTINCT FROM $4, false),
	coalesce(pg_catalog.pg_get_indexdef(i.indexrelid, 1, false), ''), coalesce(pg_catalog.pg_get_indexdef(i.indexrelid, 2, false), '')
FROM (SELECT to_regclass($1) AS oid) r
LEFT JOIN pg_catalog.pg_index i ON i.indexrelid = r.oid
LEFT JOIN pg_catalog.pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[$3::int - 1]
WHERE r.oid IS NOT NULL`
}

// arbiterProbeSQL is an INSERT into table (n.holds or n.waiters) whose
// ON CONFLICT names the columns the statements' do (grantSQL,
// markWriterSQL), for checkIndexes to plan and never run. DO NOTHING, not
// DO UPDATE: planning an UPDATE already fails on a published table
// without a replica identity (SQLSTATE 55000), as an earlier version's
// tables are until makeSchema gives them their key.
func (n names) arbiterProbeSQL(table string) string {
	conflict := n.holdsConflict()
	if table == n.waiters {
		conflict = n.waitersConflict()
	}
	return `INSERT INTO ` + table + ` (key) SELECT key FROM ` + table + ` WHERE false ON CONFLICT (` + conflict + `) DO NOTHING`
}

// lockTablesSQL takes both tables at once, first in a migration, so that
// it does not deadlock, moving from one lock to a stronger one, with an
// older lockproxy's transaction still running on them.
func (n names) lockTablesSQL() string {
	return `LOCK TABLE ` + n.holds + `, ` + n.waiters + ` IN ACCESS EXCLUSIVE MODE`
}

// dropKeySQL drops constraint name of table (sanitized).
func dropKeySQL(table, name string) string {
	return `ALTER TABLE ` + table + ` DROP CONSTRAINT ` + pgx.Identifier{name}.Sanitize()
}

// addKeySQL gives table (sanitized) its surrogate primary key: the
// column, or, when an identity column id is there already, the key on it.
// Adding the column rewrites the table, numbering the rows there.
func addKeySQL(table string, haveID bool) string {
	if haveID {
		return `ALTER TABLE ` + table + ` ADD PRIMARY KEY (id)`
	}
	return `ALTER TABLE ` + table + ` ADD COLUMN ` + surrogateKey
}

// unq is the last part of a sanitized qualified name, unquoted.
func unq(s string) string {
	i := len(s) - 2
	for i >= 0 && s[i] != '"' {
		i--
	}
	return s[i+1 : len(s)-1]
}

// ttlMS is how a duration is sent: whole milliseconds, at least 1.
func ttlMS(ttlMillis int64) int64 { return max(ttlMillis, 1) }

// Statements. $1 is always the key, whose rows are found with keyIs.
// Expiry is judged by clock_timestamp() in the statement that reads, never
// by lockproxy's clock.
func (n names) lockKeySQL() string {
	// hashtextextended: 64 bits, so two keys share a lock (and wait for
	// each other's transactions, nothing more) about never.
	return `SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`
}

// tryLockKeySQL is lockKeySQL for a waiter's retry: true when taken,
// false at once when another transaction holds it.
func (n names) tryLockKeySQL() string {
	return `SELECT pg_try_advisory_xact_lock(hashtextextended($1, 0))`
}

// queueLockKeySQL is lockKeySQL for a lockQueue try, read as
// tryLockKeySQL is: true once taken (the lock_timeout set before it ends a
// long wait).
func (n names) queueLockKeySQL() string {
	return `SELECT true FROM pg_advisory_xact_lock(hashtextextended($1, 0))`
}

// readerTryLockKeySQL is tryLockKeySQL for a waiting reader ($2 its
// token): NULL, without touching the key's lock, while a writer waits and
// the reader holds nothing of the key (the grant would refuse it anyway),
// so that a herd of readers held back by a writer does not keep the key's
// lock busy when that writer tries it.
func (n names) readerTryLockKeySQL() string {
	return `SELECT CASE WHEN EXISTS (SELECT 1 FROM ` + n.waiters + ` WHERE ` + keyIs("key") + ` AND expires_at > clock_timestamp())
	AND NOT EXISTS (SELECT 1 FROM ` + n.holds + ` WHERE ` + keyIs("key") + ` AND token = $2 AND expires_at > clock_timestamp())
	THEN NULL ELSE pg_try_advisory_xact_lock(hashtextextended($1, 0)) END`
}

func (n names) liveHoldersSQL() string {
	return `SELECT token, mode, holds, fence,
	GREATEST(0, (EXTRACT(EPOCH FROM expires_at - clock_timestamp()) * 1000)::bigint)
FROM ` + n.holds + ` WHERE ` + keyIs("key") + ` AND expires_at > clock_timestamp() ORDER BY mode, fence`
}

// heldRowsSQL reads every row of the key the lazy DELETE left, with no
// time filter, FOR SHARE, and says of each whether it is live
// (expires_at > clock_timestamp(), judged on the version read). The grant
// decides on the live ones only.
//
// Why every row, locked: a RENEW takes no advisory lock. One that updated
// A's row just before A's lease ended and commits late holds that row's
// lock; a SELECT filtered on expires_at would judge the old version,
// expired, and grant B while A's RENEW goes on to report validity. FOR
// SHARE waits for that RENEW (or UNLOCK) to end and then reads the row's
// latest version (or skips it if it went), so its outcome is seen.
//
// A RENEW that starts after this FOR SHARE cannot revive a row judged
// expired here: its UPDATE waits for the grant's transaction to end (the
// share lock), then re-checks expires_at > clock_timestamp() on the latest
// version, which is still the expired one, and the database's clock has
// only moved on (see the README's Limits for a clock that steps back).
func (n names) heldRowsSQL() string {
	return `SELECT token, mode, holds, fence,
	GREATEST(0, (EXTRACT(EPOCH FROM expires_at - clock_timestamp()) * 1000)::bigint),
	expires_at > clock_timestamp()
FROM ` + n.holds + ` WHERE ` + keyIs("key") + ` ORDER BY mode, fence FOR SHARE`
}

func (n names) writerWaitsSQL() string {
	return `SELECT EXISTS (SELECT 1 FROM ` + n.waiters + ` WHERE ` + keyIs("key") + ` AND expires_at > clock_timestamp())`
}

// dropRowsSQL deletes the rows of key $1 named by token ($2) and mode
// ($3) arrays: those a grant's read found expired.
func (n names) dropRowsSQL() string {
	return `DELETE FROM ` + n.holds + ` WHERE ` + keyIs("key") + ` AND (token, mode) IN (SELECT * FROM unnest($2::text[], $3::smallint[]))`
}

func (n names) dropExpiredOfKeySQL() string {
	return `DELETE FROM ` + n.holds + ` WHERE ` + keyIs("key") + ` AND expires_at <= clock_timestamp()`
}

// grantSQL inserts a first hold ($2 token, $3 mode, $4 ttl ms) with a new
// fence taken from the sequence in the same statement, replacing an
// expired row of the same token and mode if the sweep has not yet. The
// conflict is judged on the digests; the row replaced must also have the
// same key and token, or it is left alone and nothing is returned, so the
// grant fails rather than take another key's row.
func (n names) grantSQL() string {
	return `INSERT INTO ` + n.holds + ` AS h (key, token, mode, holds, expires_at, fence)
VALUES ($1, $2, $3, 1, clock_timestamp() + $4 * interval '1 millisecond', nextval('` + n.fences + `'))
ON CONFLICT (` + n.holdsConflict() + `) DO UPDATE SET holds = 1, expires_at = EXCLUDED.expires_at, fence = EXCLUDED.fence
WHERE h.key = EXCLUDED.key AND h.token = EXCLUDED.token
RETURNING fence`
}

// reenterSQL adds a hold to a live row ($2 token, $3 mode, $4 ttl ms) and
// extends its lease to at least the TTL, never shortening it: the caller
// may yet be told no (too slow), and the holds it had must keep the lease
// it was told of.
//
// No expiry test: the grant's read judged the row live and share-locked it
// under the key's advisory lock, so no one else can have been granted the
// key since, and the row cannot have changed; a lease that ran out in
// between is caught by the validity check before COMMIT.
func (n names) reenterSQL() string {
	return `UPDATE ` + n.holds + ` SET holds = holds + 1, expires_at = GREATEST(expires_at, clock_timestamp() + $4 * interval '1 millisecond')
WHERE ` + keyIs("key") + ` AND token = $2 AND mode = $3
RETURNING holds, fence`
}

// dropHoldSQL takes back one hold of the row of key $1, token $2, mode $3
// and fence $4 (a grant whose caller was told no): one fewer, or the row
// with its last hold, and a NOTIFY then. Whichever of it and the holder's
// own UNLOCK comes first, the two take the two holds.
func (n names) dropHoldSQL() string {
	return `WITH target AS (
	SELECT holds FROM ` + n.holds + ` WHERE ` + keyIs("key") + ` AND token = $2 AND mode = $3 AND fence = $4 FOR UPDATE),
dec AS (
	UPDATE ` + n.holds + ` h SET holds = h.holds - 1 FROM target t
	WHERE ` + keyIs("h.key") + ` AND h.token = $2 AND h.mode = $3 AND h.fence = $4 AND t.holds > 1),
del AS (
	DELETE FROM ` + n.holds + ` h USING target t
	WHERE ` + keyIs("h.key") + ` AND h.token = $2 AND h.mode = $3 AND h.fence = $4 AND t.holds = 1)
SELECT count(*) FROM (SELECT pg_notify('` + n.channel + `', md5($1)) FROM target t WHERE t.holds = 1) x`
}

// releaseSQL drops one hold of the token's first live row (write before
// read); the row goes when its last hold does. It returns the row's holds
// before the release, nothing when the token holds nothing, and notifies
// the key's waiters (at commit) when a row went. The row lock (FOR UPDATE)
// makes two releases of one token run one after the other; a grant that
// runs at the same time only sees the row a little longer.
func (n names) releaseSQL() string { return n.releaseWhereSQL("", "") }

// releaseHoldSQL is releaseSQL for the token's row of mode $3 only
// (backends.HoldKeeper): a downgraded token's other row is left as it is.
func (n names) releaseHoldSQL() string { return n.releaseWhereSQL(" AND mode = $3", "") }

// The NoWait forms of releaseSQL, releaseHoldSQL, renewSQL and
// renewHoldSQL fail at once (SQLSTATE 55P03) rather than wait for a row
// another transaction locked: a statement waits for one in the database
// only through the key's row gate (Backend.rowStatement).
func (n names) releaseNoWaitSQL() string { return n.releaseWhereSQL("", noWait) }

func (n names) releaseHoldNoWaitSQL() string { return n.releaseWhereSQL(" AND mode = $3", noWait) }

func (n names) renewNoWaitSQL() string { return n.renewLockingSQL(noWait) }

func (n names) renewHoldNoWaitSQL() string { return n.renewHoldLockingSQL(noWait) }

const noWait = " NOWAIT"

// releaseWhereSQL is releaseSQL with cond added to the choice of the row
// and wait (noWait or "") to its row lock.
func (n names) releaseWhereSQL(cond, wait string) string {
	return `WITH target AS (
	SELECT mode, holds FROM ` + n.holds + `
	WHERE ` + keyIs("key") + ` AND token = $2` + cond + ` AND expires_at > clock_timestamp()
	ORDER BY mode LIMIT 1 FOR UPDATE` + wait + `),
dec AS (
	UPDATE ` + n.holds + ` h SET holds = h.holds - 1 FROM target t
	WHERE ` + keyIs("h.key") + ` AND h.token = $2 AND h.mode = t.mode AND t.holds > 1),
del AS (
	DELETE FROM ` + n.holds + ` h USING target t
	WHERE ` + keyIs("h.key") + ` AND h.token = $2 AND h.mode = t.mode AND t.holds = 1)
SELECT t.holds, (SELECT count(*) FROM (SELECT pg_notify('` + n.channel + `', md5($1)) WHERE t.holds = 1) x)
FROM target t`
}

// notifySQL wakes the waiters of key on every lockproxy instance. pg_notify
// is transactional: it is delivered at commit. The payload is the key's
// md5, as NOTIFY payloads are limited to 8000 bytes and keys are not.
func (n names) notifySQL() string {
	return `SELECT pg_notify('` + n.channel + `', md5($1))`
}

// renewSQL resets the token's ($2) live rows on key to $3 ms. A
// downgraded token (a write row and a read row) renews its write hold: the
// write row gets exactly $3 ms, the read row is raised to as much but
// never shortened, as on the other backends, since the read hold's lease,
// told to its holder, keeps writers out for all of it. A token holding one
// row gets exactly $3 ms. No advisory lock is needed: a row the database's
// clock has expired can never match again, and a live row is the token's
// own. The rows are locked in mode order first, the order a grant's read
// locks them in, so the two never deadlock.
func (n names) renewSQL() string { return n.renewLockingSQL("") }

func (n names) renewLockingSQL(wait string) string {
	return `WITH l AS (
	SELECT mode FROM ` + n.holds + ` WHERE ` + keyIs("key") + ` AND token = $2 AND expires_at > clock_timestamp()
	ORDER BY mode FOR NO KEY UPDATE` + wait + `)
UPDATE ` + n.holds + ` h SET expires_at = CASE WHEN h.mode = 1 AND EXISTS (SELECT 1 FROM l WHERE l.mode = 0) -- read, beside a write row
	THEN GREATEST(h.expires_at, clock_timestamp() + $3 * interval '1 millisecond')
	ELSE clock_timestamp() + $3 * interval '1 millisecond' END
FROM l WHERE ` + keyIs("h.key") + ` AND h.token = $2 AND h.mode = l.mode RETURNING h.mode`
}

// renewHoldSQL raises the token's ($2) live row of mode $3 on key to $4
// ms from now but never shortens it (backends.HoldKeeper): the row holds
// every hold of the token of that mode, also those a KEEPALIVE watchdog
// does not count (taken without KEEPALIVE on another connection), whose
// holders were told of a lease of their own; renewSQL (RENEW) sets it
// exactly. Renewing the write row raises a downgrade's live read row to
// the same end but never shortens it, as renewing a write hold does on
// the other backends; renewing the read row leaves the write row alone.
// Nothing changes when the token has no live row of mode $3. The rows are
// locked in mode order, as renewSQL's are.
func (n names) renewHoldSQL() string { return n.renewHoldLockingSQL("") }

func (n names) renewHoldLockingSQL(wait string) string {
	return `WITH l AS (
	SELECT mode FROM ` + n.holds + ` WHERE ` + keyIs("key") + ` AND token = $2 AND mode >= $3 AND expires_at > clock_timestamp()
	ORDER BY mode FOR NO KEY UPDATE` + wait + `)
UPDATE ` + n.holds + ` h SET expires_at = GREATEST(h.expires_at, clock_timestamp() + $4 * interval '1 millisecond')
FROM l WHERE ` + keyIs("h.key") + ` AND h.token = $2 AND h.mode = l.mode AND EXISTS (SELECT 1 FROM l WHERE l.mode = $3)
RETURNING h.mode`
}

// readySQL tells ($1 holds, $2 waiting_writers, $3 fence, as names spells
// them) whether the session is read-only and whether its role may change
// both tables and take fences (nextval needs USAGE or UPDATE), and reads
// both tables, which fails when they are gone. A privilege function given
// a list answers whether any one is held: each is asked alone. INSERT and
// UPDATE may be granted on columns (has_any_column_privilege counts those
// too), DELETE only on the table.
func (n names) readySQL() string {
	return `SELECT current_setting('transaction_read_only') = 'on',
	has_any_column_privilege($1, 'INSERT') AND has_any_column_privilege($1, 'UPDATE') AND has_table_privilege($1, 'DELETE')
	AND has_any_column_privilege($2, 'INSERT') AND has_any_column_privilege($2, 'UPDATE') AND has_table_privilege($2, 'DELETE')
	AND has_sequence_privilege($3, 'USAGE, UPDATE'),
	EXISTS (SELECT FROM ` + n.holds + `), EXISTS (SELECT FROM ` + n.waiters + `)`
}

// markWriterSQL records or refreshes a waiting writer ($2 waiter id, $3
// ms); a row of the same digest and waiter but another key is left alone,
// as grantSQL leaves one.
func (n names) markWriterSQL() string {
	return `INSERT INTO ` + n.waiters + ` AS w (key, waiter, expires_at) VALUES ($1, $2, clock_timestamp() + $3 * interval '1 millisecond')
ON CONFLICT (` + n.waitersConflict() + `) DO UPDATE SET expires_at = EXCLUDED.expires_at
WHERE w.key = EXCLUDED.key`
}

// unmarkWriterNotifySQL deletes a waiting writer's marker ($2) and wakes
// the readers it held back (at commit).
func (n names) unmarkWriterNotifySQL() string {
	return `WITH d AS (DELETE FROM ` + n.waiters + ` WHERE ` + keyIs("key") + ` AND waiter = $2 RETURNING key)
SELECT pg_notify('` + n.channel + `', md5(key)) FROM d`
}

// sweepSQL deletes up to $1 expired rows of table and notifies each key's
// waiters once: a waiter behind a lease that ran out wakes without polling.
// The expiry is checked again on the row deleted: a row granted anew
// (ON CONFLICT) since the inner SELECT is a live row and stays. The rows
// are locked FOR UPDATE SKIP LOCKED, as they are found: a row a grant's
// lazy DELETE (index order) or a RENEW holds is left to them, so the
// sweep (ctid order) never waits on a grant while holding rows that grant
// is about to delete, which deadlocked them. The inner SELECT compares
// with statement_timestamp(), which PostgreSQL can use as an index
// condition on expires_at (a volatile clock_timestamp() made it read the
// whole table, live rows and all, on every round); the outer check on
// clock_timestamp() is what keeps a row granted anew.
func (n names) sweepSQL(table string) string {
	return `WITH gone AS (
	DELETE FROM ` + table + ` WHERE ctid IN (
		SELECT ctid FROM ` + table + ` WHERE expires_at < statement_timestamp() LIMIT $1 FOR UPDATE SKIP LOCKED)
		AND expires_at < clock_timestamp()
	RETURNING key)
SELECT (SELECT count(*) FROM gone),
	(SELECT count(*) FROM (SELECT pg_notify('` + n.channel + `', md5(key)) FROM (SELECT DISTINCT key FROM gone) d) x)`
}

// keyTag is what notifySQL sends for key.
func keyTag(key string) string {
	s := md5.Sum([]byte(key))
	return hex.EncodeToString(s[:])
}

func (n names) String() string { return fmt.Sprintf("%s, %s, %s", n.holds, n.waiters, n.fences) }

// Keys and tokens are binary-safe, and a text column takes valid UTF-8
// without NUL bytes only (anything else fails with SQLSTATE 22021). dbText
// stores such a string as encodedMark and its base64, and every other one
// as it is, except one that starts with encodedMark itself, which is
// encoded too: so the mapping is injective, and the keys and tokens
// clients use in practice are stored, and seen in the tables, as they are.
const encodedMark = "\x01"

// dbText is dbTextFor on a database whose connections take UTF-8 as it
// is.
func dbText(s string) string { return dbTextFor(s, false) }

// dbTextFor is how s is stored. asciiOnly (see rawTextSafe) encodes every
// string with a byte outside ASCII as well. ASCII is the same bytes in
// every encoding PostgreSQL serves, so the stored form does not depend on
// the database's encoding's conversions.
func dbTextFor(s string, asciiOnly bool) string {
	if utf8.ValidString(s) && !strings.ContainsRune(s, 0) && !strings.HasPrefix(s, encodedMark) && (!asciiOnly || isASCII(s)) {
		return s
	}
	return encodedMark + base64.RawStdEncoding.EncodeToString([]byte(s))
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			return false
		}
	}
	return true
}

// rawTextSafe reports whether a database whose server_encoding is server
// stores every valid UTF-8 string without NUL bytes, sent by a connection
// whose client_encoding is UTF8 (New sets it), as its own bytes: a UTF8
// one does, and a SQL_ASCII one takes any bytes as they are. Any other
// converts: a multi-byte one (EUC_JP, …) refuses most UTF-8 characters
// (SQLSTATE 22021 when they were read in its encoding), and every one
// refuses those it lacks (22P05).
func rawTextSafe(server string) bool { return server == "UTF8" || server == "SQL_ASCII" }

// fromDBText undoes dbText.
func fromDBText(s string) string {
	if rest, ok := strings.CutPrefix(s, encodedMark); ok {
		if b, err := base64.RawStdEncoding.DecodeString(rest); err == nil {
			return string(b)
		}
	}
	return s
}
