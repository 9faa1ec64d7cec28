package postgres

import (
	"cmp"
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/lockproxy/lockproxy/backends"
	"github.com/lockproxy/lockproxy/quorum"
)

// Config configures a Backend.
type Config struct {
	// DSN is a libpq connection string or URL (it may hold the password).
	DSN string
	// Schema holds the backend's tables; it must exist.
	Schema string
	// TablePrefix starts every table's name ("lockproxy_" →
	// lockproxy_holds, lockproxy_waiting_writers, lockproxy_fence).
	TablePrefix string
	// PoolSize caps the connections taken from the database, besides the
	// one that LISTENs. 0: pgx's default.
	PoolSize int32
	// SweepInterval is how often expired rows are deleted (at most
	// sweepBatch × sweepRounds per table each time).
	SweepInterval time.Duration
	// DriftFactor and DriftMin make the drift allowance subtracted from
	// every validity, as for RedLock: ttl × DriftFactor + DriftMin.
	DriftFactor float64
	DriftMin    time.Duration
	// ListenCheck replaces listenCheckEvery (tests); 0 keeps it.
	ListenCheck time.Duration
	// OpTimeout bounds each operation on the database (one lock try, an
	// unlock, a renewal, a LOCKINFO), so that a database that hangs gets an
	// error reply, not a client that hangs with it; 0 means 5 s.
	OpTimeout time.Duration
	// StartTimeout bounds New's first connection and schema check;
	// 0 means 10 s.
	StartTimeout time.Duration
	Logger       *zap.Logger
}

const (
	// retryMin and retryMax bound the jittered pause between the tries of
	// a waiting LOCK while no NOTIFY can come (the listening connection is
	// down).
	retryMin = 25 * time.Millisecond
	retryMax = 200 * time.Millisecond
	// notifyWaitMax bounds a waiter's sleep while NOTIFYs can wake it.
	notifyWaitMax = time.Second
	// writerMarkTTL is the life of a waiting writer's marker, refreshed on
	// every try (each at most notifyWaitMax apart), so a marker outlives a
	// dead lockproxy by seconds only.
	writerMarkTTL = 3 * time.Second
	// sweepBatch rows per DELETE, sweepRounds DELETEs per table per sweep:
	// a sweep never holds row locks on many rows at once or runs long.
	sweepBatch  = 1000
	sweepRounds = 10
	// sweepCatchUp is the pause after a sweep that left expired rows
	// behind (a table's every round was full): the next comes this soon,
	// not a sweep_interval later, so that expired rows are deleted as
	// fast as they come however many one-time keys expire, rather than
	// sweepRounds × sweepBatch per table per interval (1,000 a second at
	// the defaults) and the tables grow without bound past that.
	sweepCatchUp = 100 * time.Millisecond
	// cleanupTimeout bounds the statements run after a caller's context
	// ended (a waiting writer's marker removed, a grant the caller never
	// saw dropped).
	cleanupTimeout = 5 * time.Second
	// listenBackoffMin is the first pause before the listening connection
	// is dialed again, doubled after each loss up to listenBackoffMax, and
	// back to it once a connection worked for longer than the pause.
	listenBackoffMin = 100 * time.Millisecond
	// listenBackoffMax caps the pause between reconnections of the
	// listening connection.
	listenBackoffMax = 5 * time.Second
	// listenCheckEvery is how long the listening connection may stay
	// silent before it is checked with a round trip (within OpTimeout): a
	// connection a NAT or firewall forgot stays open and silent, and
	// waiters would fall back to polling without a word.
	listenCheckEvery = 30 * time.Second
)

// Backend is a backends.Backend over one PostgreSQL database.
type Backend struct {
	cfg       Config
	n         names
	idleTxSQL string // SET LOCAL idle_in_transaction_session_timeout, first in a grant
	// asciiOnly: the database's encoding does not store every UTF-8
	// string as it is (rawTextSafe), so keys and tokens that are not
	// plain ASCII are stored encoded (dbTextFor). Set by setup.
	asciiOnly bool
	pool      *pgxpool.Pool
	log       *zap.Logger
	addr      string // host:port, for INFO and errors

	ctx    context.Context // ends at Close: the listener, sweeper, cleanups
	cancel context.CancelFunc
	bg     sync.WaitGroup

	listening atomic.Bool
	wakeups   atomic.Int64
	swept     atomic.Int64
	// retries counts the statements rerun ran again, by what they were
	// for and the SQLSTATE (retryCodes) that rolled them back.
	retries [numRetryOps][len(retryCodes)]atomic.Int64

	mu      sync.Mutex
	closed  bool
	waiters map[string]map[*waiter]struct{} // keyTag → Lock calls waiting here
	byKey   map[string]int                  // key → Lock calls waiting here
	waiting int
	gates   map[string]*keyGate // key → this instance's first tries of it (enterGate)
	// rowGates: key → this instance's RENEWs and UNLOCKs of it
	// (enterRowGate).
	rowGates map[string]*keyGate
}

// keyGate lets one first try of a key at a time run its transaction, which
// queues on the key's advisory lock inside a pooled connection: the
// others wait in the process, holding no connection. A channel of one
// slot: goroutines blocked sending on it are served in arrival order, as
// the database's queue on the advisory lock would serve them.
type keyGate struct {
	slot chan struct{}
	refs int // tries holding or waiting for slot; guarded by Backend.mu
}

// waiter is one waiting Lock call; wake gets a value when the key may
// have been released.
type waiter struct {
	key, tag string
	wake     chan struct{}
}

var errClosed = errors.New("postgres: backend closed")

// The causes of a DSN that pgx cannot parse. They are fixed texts, as they
// must never carry any of the DSN, which may hold the password.
var (
	errDSNFile     = errors.New("a file it names (sslrootcert, sslcert, sslkey or a service file) cannot be read")
	errDSNURL      = errors.New("not a valid postgres:// URL, or a setting in it is invalid (reserved characters in the user name and password must be percent-encoded)")
	errDSNKeywords = errors.New("not valid keyword=value settings, or a setting in it is invalid (a value with spaces or quotes goes in single quotes)")
)

// dsnParseCause is the cause shown for pgx's parse error err of dsn.
func dsnParseCause(dsn string, err error) error {
	var pe *fs.PathError
	switch {
	case errors.As(err, &pe):
		return errDSNFile
	case strings.HasPrefix(dsn, "postgres://"), strings.HasPrefix(dsn, "postgresql://"):
		return errDSNURL
	}
	return errDSNKeywords
}

// New connects to the database, creates the tables when missing (or checks
// that they exist when the role may not create them), and starts the
// listening connection and the sweep.
func New(cfg Config) (*Backend, error) {
	if cfg.Schema == "" {
		cfg.Schema = "public"
	}
	if !ValidIdent(cfg.Schema, false) {
		return nil, fmt.Errorf("postgres: schema %q must be a lower-case SQL identifier", cfg.Schema)
	}
	if !ValidIdent(cfg.TablePrefix, true) {
		return nil, fmt.Errorf("postgres: table prefix %q must be a lower-case SQL identifier of at most %d bytes", cfg.TablePrefix, maxPrefix)
	}
	if cfg.SweepInterval <= 0 {
		cfg.SweepInterval = 10 * time.Second
	}
	if cfg.StartTimeout <= 0 {
		cfg.StartTimeout = 10 * time.Second
	}
	if cfg.OpTimeout <= 0 {
		cfg.OpTimeout = 5 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	pcfg, err := pgxpool.ParseConfig(cfg.DSN)
	if err != nil {
		// pgx's message quotes the DSN, whose password its redaction
		// misses when spaces surround the '=' ("password = x"), and its
		// inner errors may quote a value too: none of it is shown, only a
		// fixed cause.
		return nil, fmt.Errorf("postgres.dsn: cannot be parsed: %w", dsnParseCause(cfg.DSN, err))
	}
	if cfg.PoolSize > 0 {
		pcfg.MaxConns = cfg.PoolSize
	}
	if pcfg.ConnConfig.ConnectTimeout == 0 {
		pcfg.ConnConfig.ConnectTimeout = 5 * time.Second
	}
	// Every connection, of every instance, sends and reads keys and
	// tokens as UTF-8 whatever the DSN or the database says: the server
	// reads a string's bytes in the connection's client_encoding, so two
	// instances with different ones stored, locked and looked up one key
	// as two (two holders at once). See rawTextSafe for the database's
	// side. The listening connection copies this config.
	pcfg.ConnConfig.RuntimeParams["client_encoding"] = "UTF8"
	pcfg.AfterConnect = checkClientEncoding
	b := &Backend{
		cfg: cfg,
		// A lockproxy that stops in the middle of a grant's transaction
		// (paused, partitioned with its connection left open) would keep
		// the key's advisory lock from every other instance; the server
		// ends such a session once the transaction could no longer be
		// finished anyway. It is set in the transaction (SET LOCAL), not
		// as a startup parameter, which PgBouncer refuses.
		idleTxSQL: fmt.Sprintf("SET LOCAL idle_in_transaction_session_timeout = %d", max(cfg.OpTimeout.Milliseconds(), 1000)),
		n:         newNames(cfg.Schema, cfg.TablePrefix),
		log:       cfg.Logger,
		addr:      net.JoinHostPort(pcfg.ConnConfig.Host, strconv.Itoa(int(pcfg.ConnConfig.Port))),
		waiters:   map[string]map[*waiter]struct{}{},
		byKey:     map[string]int{},
		gates:     map[string]*keyGate{},
		rowGates:  map[string]*keyGate{},
	}
	ctx, cancel := context.WithTimeout(context.Background(), cfg.StartTimeout)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, fmt.Errorf("postgres: %s: %w", b.addr, err)
	}
	b.pool = pool
	if err := b.setup(ctx); err != nil {
		pool.Close()
		return nil, err
	}
	b.ctx, b.cancel = context.WithCancel(context.Background())
	b.bg.Add(2)
	go b.listen()
	go b.sweep()
	return b, nil
}

// setup checks the database answers and makes the schema's objects, or
// brings a schema made by an earlier version up to date (makeSchema). When
// all is there, it changes nothing, so a role that may not create or
// alter the tables runs on tables an owner made.
func (b *Backend) setup(ctx context.Context) error {
	var server string
	if err := b.rerun(ctx, opSetup, func() error {
		return b.pool.QueryRow(ctx, `SELECT current_setting('server_encoding')`).Scan(&server)
	}); err != nil {
		return fmt.Errorf("postgres: %s: %s: %w", b.addr, reason(err), err)
	}
	b.asciiOnly = !rawTextSafe(server)
	if b.asciiOnly {
		b.log.Info("postgres: keys and tokens that are not plain ASCII are stored base64-encoded, as the database's encoding is not UTF8",
			zap.String("server_encoding", server))
	}
	q, args := b.n.schemaStateSQL()
	var tables, indexes, keyed bool
	if err := b.rerun(ctx, opSetup, func() error {
		return b.pool.QueryRow(ctx, q, args...).Scan(&tables, &indexes, &keyed)
	}); err != nil {
		return fmt.Errorf("postgres: %s: %s: %w", b.addr, reason(err), err)
	}
	if tables {
		// Before any upgrade: one refused leaves the tables as they were.
		if err := b.rerun(ctx, opSetup, func() error { return b.checkIndexes(ctx, b.pool) }); err != nil {
			return err
		}
	}
	switch {
	case !tables:
		if err := b.makeSchema(ctx); err != nil {
			var pe *pgconn.PgError
			if errors.As(err, &pe) && (pe.Code == "42501" || pe.Code == "3F000") {
				return fmt.Errorf("postgres: cannot create the lock tables (%s) in schema %q: %s; "+
					"have an owner create them (see the README's \"PostgreSQL backend\") or grant CREATE on the schema", b.n, b.cfg.Schema, pe.Message)
			}
			var ue *unfitIndexError
			if errors.As(err, &ue) {
				return ue
			}
			return fmt.Errorf("postgres: create the lock tables: %s: %w", reason(err), err)
		}
		b.log.Info("postgres: lock tables ready", zap.String("tables", b.n.String()))
	case !indexes || !keyed:
		if err := b.makeSchema(ctx); err != nil {
			var pe *pgconn.PgError
			if errors.As(err, &pe) && pe.Code == "42501" {
				return fmt.Errorf("postgres: the lock tables (%s) were made by an earlier version and must be upgraded "+
					"(unique indexes on the keys' SHA-256 and a surrogate primary key id instead of primary keys on the keys), which this role may not do: %s; "+
					"have their owner start this version once, or run the upgrade in the README's \"PostgreSQL backend\"", b.n, pe.Message)
			}
			var ue *unfitIndexError
			if errors.As(err, &ue) {
				return ue
			}
			return fmt.Errorf("postgres: upgrade the lock tables (%s): %s: %w", b.n, reason(err), err)
		}
		b.log.Warn("postgres: lock tables upgraded: keys and tokens are indexed by their SHA-256, the primary keys are a surrogate id; "+
			"lockproxy instances of earlier versions on these tables now fail every grant",
			zap.String("tables", b.n.String()))
	}
	// CREATE SEQUENCE IF NOT EXISTS keeps a sequence made beforehand, with
	// whatever cache or cycle it has.
	return b.rerun(ctx, opSetup, func() error { return b.checkSequence(ctx) })
}

// makeSchema creates what is missing, checks the unique indexes fit
// (checkIndexes), and replaces the tables' primary keys (an earlier
// version's, on the whole key: see digest) with the surrogate ones, or
// adds those (the first version with the digests had none), in one
// transaction, under an advisory lock so that lockproxies starting
// together do not trip over each other's CREATE … IF NOT EXISTS or
// migrate twice. Rows held across it stay, with their fences: only the
// indexes and keys change. A transaction rolled back for a deadlock (an earlier
// version's grant running on the tables) is run again (rerun).
func (b *Backend) makeSchema(ctx context.Context) error {
	return b.rerun(ctx, opSetup, func() error {
		return pgx.BeginTxFunc(ctx, b.pool, pgx.TxOptions{}, b.makeSchemaTx(ctx))
	})
}

func (b *Backend) makeSchemaTx(ctx context.Context) func(pgx.Tx) error {
	return func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`, "lockproxy schema "+b.n.holds); err != nil {
			return err
		}
		q, args := b.n.schemaStateSQL()
		var tables, indexes, keyed bool
		if err := tx.QueryRow(ctx, q, args...).Scan(&tables, &indexes, &keyed); err != nil {
			return err
		}
		if tables && indexes && keyed {
			// Another lockproxy did it while this one waited.
			return b.checkIndexes(ctx, tx)
		}
		if tables {
			// Both at once, before any other statement: taken one by
			// one, or a weaker lock raised later, they could deadlock
			// with an earlier version's grant running on them.
			if _, err := tx.Exec(ctx, b.n.lockTablesSQL()); err != nil {
				return err
			}
		}
		for _, s := range b.n.schemaSQL() {
			if _, err := tx.Exec(ctx, s); err != nil {
				return err
			}
		}
		// Again, under the locks: an index of the name made since
		// setup's check was kept by IF NOT EXISTS, and the earlier
		// primary keys must not go unless the unique indexes fit.
		if err := b.checkIndexes(ctx, tx); err != nil {
			return err
		}
		return b.addKeys(ctx, tx)
	}
}

// minFenceMax is the least maximum a fence sequence may have: 2^53, which
// lasts 285 years at a million grants a second. A sequence made beforehand
// AS integer (2^31 - 1, some weeks at a thousand grants a second) or with
// a low MAXVALUE would run out, and every LOCK fail from then on.
const minFenceMax = 1 << 53

// checkSequence refuses a fence sequence with a cache (each connection
// would hand out values from a block of its own, and a later grant could
// get a smaller fence), one that cycles (after its maximum it would
// start again from its minimum), one that descends, one that would run out
// (minFenceMax), and an UNLOGGED one
// or holds table: crash recovery resets an unlogged sequence to its start
// and empties an unlogged table, so later grants would get smaller fences
// and locks granted before the crash would be granted again. Objects made
// beforehand are kept as they are (CREATE … IF NOT EXISTS).
func (b *Backend) checkSequence(ctx context.Context) error {
	var cache, increment, max int64
	var cycle bool
	var seqPersistence, holdsPersistence string
	err := b.pool.QueryRow(ctx, `SELECT s.seqcache, s.seqcycle, s.seqincrement, s.seqmax, c.relpersistence::text,
	coalesce((SELECT h.relpersistence::text FROM pg_catalog.pg_class h WHERE h.oid = to_regclass($2)), '')
FROM pg_catalog.pg_sequence s JOIN pg_catalog.pg_class c ON c.oid = s.seqrelid WHERE s.seqrelid = to_regclass($1)`,
		b.n.fences, b.n.holds).Scan(&cache, &cycle, &increment, &max, &seqPersistence, &holdsPersistence)
	switch {
	case err != nil:
		return fmt.Errorf("postgres: read the fence sequence %s: %s: %w", b.n.fences, reason(err), err)
	case cache > 1:
		return fmt.Errorf("postgres: the fence sequence %s has CACHE %d: fences would not grow across connections; run ALTER SEQUENCE %s CACHE 1", b.n.fences, cache, b.n.fences)
	case cycle:
		return fmt.Errorf("postgres: the fence sequence %s is CYCLE: fences would start again from its minimum after its maximum; run ALTER SEQUENCE %s NO CYCLE", b.n.fences, b.n.fences)
	case increment <= 0:
		return fmt.Errorf("postgres: the fence sequence %s has INCREMENT BY %d: fences would not grow; run ALTER SEQUENCE %s INCREMENT BY 1 MAXVALUE 9223372036854775807 RESTART WITH a value above every fence handed out", b.n.fences, increment, b.n.fences)
	case max < minFenceMax:
		return fmt.Errorf("postgres: the fence sequence %s ends at %d: once there every LOCK would fail; run ALTER SEQUENCE %s AS bigint MAXVALUE 9223372036854775807", b.n.fences, max, b.n.fences)
	case seqPersistence == "u":
		return fmt.Errorf("postgres: the fence sequence %s is UNLOGGED: crash recovery would reset it and later grants would get smaller fences; run ALTER SEQUENCE %s SET LOGGED", b.n.fences, b.n.fences)
	case holdsPersistence == "u":
		return fmt.Errorf("postgres: the lock table %s is UNLOGGED: crash recovery would empty it and locks still held would be granted again; run ALTER TABLE %s SET LOGGED", b.n.holds, b.n.holds)
	}
	return nil
}

// checkClientEncoding refuses a connection whose client_encoding is not
// UTF8 (one set in the DSN's options, which New's cannot override): see
// New.
func checkClientEncoding(_ context.Context, conn *pgx.Conn) error {
	if enc := conn.PgConn().ParameterStatus("client_encoding"); enc != "UTF8" {
		return fmt.Errorf("postgres: the connection's client_encoding is %s; lockproxy needs UTF8 (remove client_encoding from the DSN's options)", enc)
	}
	return nil
}

// usable fails fast after Close.
func (b *Backend) usable() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return errClosed
	}
	return nil
}

// Ready reports whether a lock can be granted now, in one bounded
// statement: the session may write, its role may change the lock tables
// and take fences, and the tables can be read. A database that answers
// queries may still grant nothing (a hot standby the DSN reaches after a
// failover, default_transaction_read_only on, a role granted SELECT
// alone, the tables dropped), and /readyz must then send clients
// elsewhere. The error reads as the grants' own would (fail).
func (b *Backend) Ready(ctx context.Context) error {
	if err := b.usable(); err != nil {
		return err
	}
	octx, cancel := b.op(ctx)
	defer cancel()
	var readOnly, mayWrite bool
	var holds, waiters bool // whether rows exist: unused, the reads are the check
	// At serializable, the reads of both tables are rolled back (40001)
	// now and then beside grants and releases: run again (rerun), or
	// /readyz sent clients away from a working instance.
	if err := b.rerun(octx, opReady, func() error {
		return b.pool.QueryRow(octx, b.n.readySQL(), b.n.holds, b.n.waiters, b.n.fences).Scan(&readOnly, &mayWrite, &holds, &waiters)
	}); err != nil {
		return b.fail(ctx, err)
	}
	switch {
	case readOnly:
		// The SQLSTATEs a grant would get: its first write's, or its
		// first statement on a table it may not change.
		return b.fail(ctx, &pgconn.PgError{Code: "25006", Message: "transaction_read_only is on"})
	case !mayWrite:
		return b.fail(ctx, &pgconn.PgError{Code: "42501", Message: "the role may not insert, update and delete rows of " +
			b.n.holds + " and " + b.n.waiters + ", or take values of " + b.n.fences})
	}
	return nil
}

// Close stops the listener and the sweep and closes the pool.
func (b *Backend) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	b.mu.Unlock()
	b.cancel()
	b.bg.Wait()
	// pgx closes a connection given up on in the middle of a statement
	// with a cancel request to the server, bounded by 15 s, and the
	// pool's Close waits for every one: with the database unreachable (a
	// partition, a frozen host) that held lockproxy's exit up to 15 s
	// past its drain. Nothing is left to do on those connections (the
	// locks were released, or are left to expire, before Close), so
	// Close waits for them no longer than for one operation.
	done := make(chan struct{})
	go func() {
		b.pool.Close()
		close(done)
	}()
	wait := time.NewTimer(b.cfg.OpTimeout)
	defer wait.Stop()
	select {
	case <-done:
		return nil
	case <-wait.C:
		return fmt.Errorf("postgres: pool connections not closed within op_timeout (%v); left closing", b.cfg.OpTimeout)
	}
}

// Lock implements backends.Backend.
func (b *Backend) Lock(ctx context.Context, req backends.LockRequest) (backends.Lease, error) {
	lease, err := b.lock(ctx, b.storable(req))
	if err == nil {
		lease.Token = req.Token
	}
	return lease, err
}

// storable is req with its key and token in the form the tables store.
func (b *Backend) storable(req backends.LockRequest) backends.LockRequest {
	req.Key, req.Token = b.text(req.Key), b.text(req.Token)
	return req
}

// text is s in the form the tables store (dbTextFor): on a database whose
// connections may not take every UTF-8 string as it is (asciiOnly), every
// one that is not plain ASCII is encoded.
func (b *Backend) text(s string) string { return dbTextFor(s, b.asciiOnly) }

// lock is Lock with the key and token in the form the tables store.
func (b *Backend) lock(ctx context.Context, req backends.LockRequest) (backends.Lease, error) {
	if err := b.usable(); err != nil {
		return backends.Lease{}, err
	}
	var w *waiter
	if req.Wait > 0 {
		w = b.addWaiter(req.Key)
		defer b.removeWaiter(w)
	}
	deadline := time.Now().Add(req.Wait)
	marker := ""
	defer func() {
		if marker != "" {
			b.unmarkWriter(ctx, req.Key, marker)
		}
	}()
	quick := false // the last pause was the quick one after a busy key
	// expectFree: the last pause ended as the key was likely freed (a
	// NOTIFY, or the conflicting lease's end); queueNext: a writer's try
	// then found the key's advisory lock taken, so the next one queues for
	// it briefly (lockQueue) instead of only trying it, and so on until a
	// try gets the lock.
	expectFree, queueNext := false, false
	// failed is the last try's error when the database could not decide
	// it: a waiting LOCK waits through that, as the RedLock backend does
	// through a try without a quorum, and answers it if its WAIT ends so.
	var failed error
	notAcquired := func() (backends.Lease, error) {
		if failed != nil {
			return backends.Lease{}, failed
		}
		return backends.Lease{}, backends.ErrNotAcquired
	}
	// lost is this call's last grant whose caller (this loop) was told
	// no though its row may be committed, while its take-back (dropGrant)
	// runs; redo are the fences of those whose take-back failed. A retry of
	// the same token would find that row and join it (a reentry): it would
	// be told it holds the key, the row would keep one hold more than it
	// was told of, and its one UNLOCK would leave the key held for a
	// lease. So the retry waits for the take-back, and redoes a failed one
	// in its own transaction, under the key's lock, before it decides. They
	// are kept until a transaction that redid them commits: one whose
	// COMMIT is lost in turn may not have dropped them, while its own grant
	// joins the list when its take-back fails too.
	var lost *lostGrant
	var redo []uint64
	defer func() {
		for _, fence := range redo {
			b.dropGrant(req, fence) // best effort, as for a first try
		}
	}()
	for tries := 0; ; {
		if tries > 0 {
			if err := b.usable(); err != nil {
				return backends.Lease{}, err // closed while waiting
			}
		}
		if lost != nil {
			t := time.NewTimer(time.Until(deadline))
			select {
			case derr := <-lost.done:
				// A take-back that failed before its COMMIT is redone; one
				// whose COMMIT failed is not: it may have taken the hold,
				// and a redo would take one that a LOCK of the same token
				// joined (told it holds the key). Its hold, if still there,
				// is left to its lease, as a first try's.
				if derr != nil && !errors.Is(derr, errTakeBackUnknown) {
					redo = append(redo, lost.fence)
				}
				lost = nil
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return backends.Lease{}, ctx.Err()
			}
			t.Stop()
			if lost != nil {
				return notAcquired()
			}
		}
		// The first try queues on the key's advisory lock; the retries
		// only try it, so that waiters on a hot key do not hold pool
		// connections queued behind each other, except a writer's right
		// after a try that found the key likely free but its lock taken
		// (see lockQueue).
		how := lockWait
		if tries > 0 {
			how = lockTry
			if queueNext {
				how = lockQueue
			}
		}
		lease, left, lostNow, err := b.try(ctx, req, marker, how, &redo)
		lost = lostNow
		tries++
		// A lockQueue try that ran out queues again next time: its
		// queueLockTimeout may end before its turn on a loaded database.
		queueNext = req.Mode == backends.Write && (expectFree || how == lockQueue) && errors.Is(err, errKeyBusy)
		if err == nil {
			marker = "" // deleted by the grant's transaction
		}
		failed = nil
		if req.Wait > 0 && waitable(err) {
			failed, err = err, backends.ErrNotAcquired
		}
		if !errors.Is(err, backends.ErrNotAcquired) {
			return lease, err
		}
		if req.Wait <= 0 || time.Until(deadline) <= 0 {
			return notAcquired()
		}
		if req.Mode == backends.Write {
			// Writer preference: new readers on every instance wait while
			// this marker lives.
			if marker == "" {
				marker = newID()
			}
			if err := b.markWriter(ctx, req.Key, marker); err != nil {
				if !waitable(err) {
					return backends.Lease{}, err
				}
				failed = err
			}
		}
		remaining := time.Until(deadline) // after the marker's round trip
		if remaining <= 0 {
			return notAcquired()
		}
		pause := b.pause(left)
		byLeft := left > 0 && pause >= left+2*time.Millisecond // ends when the conflicting lease does
		if failed != nil {
			// The database failed: about a second, not the quick polls
			// of a lost listening connection, so that waiters do not
			// dial a database that is down many times a second; the
			// listening connection's return wakes them all.
			pause = notifyWaitMax*3/4 + rand.N(notifyWaitMax/4)
			byLeft = false
		}
		if errors.Is(err, errKeyBusy) && !quick {
			// Another transaction is deciding on the key and may free it
			// now: look again once soon, then as any refused try.
			pause, quick = keyBusyMin+rand.N(keyBusyMax-keyBusyMin), true
		} else {
			quick = false
		}
		pause = min(pause, remaining)
		t := time.NewTimer(pause)
		select {
		case <-w.wake:
			b.wakeups.Add(1)
			expectFree = true
		case <-t.C:
			expectFree = byLeft
		case <-ctx.Done():
			t.Stop()
			return backends.Lease{}, ctx.Err()
		}
		t.Stop()
	}
}

// lockHow is how a try takes the key's advisory lock.
type lockHow uint8

const (
	// lockWait (a first try) waits for it in the database, one try per
	// key and instance at a time (enterGate).
	lockWait lockHow = iota
	// lockTry (a retry) only tries it: busy, the try ends with
	// actKeyBusy.
	lockTry
	// lockQueue (a writer's retry after a lockTry that found the lock
	// taken just as the key was likely freed) waits for it in the
	// database up to queueLockTimeout, one per key and instance at a time
	// as lockWait (enterGate), then ends as key busy. Only
	// trying, a waiting writer could be kept from a free key for its
	// whole WAIT: the first tries of readers it holds back (each refused)
	// queue on the lock one after another, so that it is nearly always
	// taken; queued, the writer comes next.
	lockQueue
)

// queueLockTimeout bounds a lockQueue try's wait for the key's advisory
// lock: longer than a check of the key takes, so short that a stalled
// transaction holding it keeps a pool connection that long only.
const queueLockTimeout = 50 * time.Millisecond

// enterGate waits, within ctx, until key's gate is this call's; release
// gives it to the next call waiting, in arrival order.
func (b *Backend) enterGate(ctx context.Context, key string) (release func(), err error) {
	return b.enterGateOf(b.gates, ctx, key)
}

// enterRowGate is enterGate for the statements that lock a key's rows
// (RENEW, UNLOCK and a KEEPALIVE watchdog's renewal and release): a
// grant's transaction share-locks every row of its key until it ends, and
// an instance stalled inside one keeps them up to op_timeout. Each such
// statement of the key's holders would wait for them inside a pooled
// connection, and a key held by many (readers) through one instance would
// take the whole pool from every other key. One waits in the database, the
// others here. Only a statement whose NoWait form found a row locked comes
// here (rowStatement): those of free rows are not held behind it. A gate
// apart from the first tries': those wait for the key's advisory lock,
// which a RENEW does not need.
func (b *Backend) enterRowGate(ctx context.Context, key string) (release func(), err error) {
	return b.enterGateOf(b.rowGates, ctx, key)
}

// rowStatement runs a RENEW's or UNLOCK's statement of key: first in its
// NoWait form, which a locked row fails at once, so that statements of
// the key whose rows are free (another token's) neither wait for nor
// queue behind one that waits; then, only when a row was locked, in its
// waiting form through the key's row gate (enterRowGate).
//
// Each is one statement, at the session's default isolation: on a database
// whose default_transaction_isolation is repeatable read or serializable,
// one that waited for a row another transaction updated (a renewal or a
// release of the same token, a reentry) fails with SQLSTATE 40001 and is
// rolled back, with nothing applied, so it is run again, within ctx
// (rerun, counted under op).
func (b *Backend) rowStatement(ctx context.Context, op retryOp, key string, run func(noWait bool) error) error {
	return b.rerun(ctx, op, func() error { return b.rowStatementOnce(ctx, key, run) })
}

func (b *Backend) rowStatementOnce(ctx context.Context, key string, run func(noWait bool) error) error {
	err := run(true)
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "55P03" { // lock_not_available
		return err
	}
	release, err := b.enterRowGate(ctx, key)
	if err != nil {
		return fmt.Errorf("waiting for this instance's statement of the key before: %w", err)
	}
	defer release()
	return run(false)
}

func (b *Backend) enterGateOf(gates map[string]*keyGate, ctx context.Context, key string) (release func(), err error) {
	b.mu.Lock()
	g := gates[key]
	if g == nil {
		g = &keyGate{slot: make(chan struct{}, 1)}
		gates[key] = g
	}
	g.refs++
	b.mu.Unlock()
	leave := func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		if g.refs--; g.refs == 0 {
			delete(gates, key)
		}
	}
	select {
	case g.slot <- struct{}{}:
	case <-ctx.Done():
		leave()
		return nil, ctx.Err()
	}
	return func() {
		<-g.slot
		leave()
	}, nil
}

// A retry that found the key's advisory lock taken looks again once after
// 20–50 ms (longer than a check of the key takes), then as any refused try.
const (
	keyBusyMin = 20 * time.Millisecond
	keyBusyMax = 50 * time.Millisecond
)

// pause is how long a waiter sleeps before its next try unless a NOTIFY
// wakes it: while the listening connection is up, until the conflicting
// lease ends (left, +2 ms; a lease that runs out is announced only by the
// sweep) or about a second, as a release wakes it; while it is down, 25–200
// ms. Jittered, so that waiters spread their tries. (A retry that found the
// key's advisory lock taken sleeps 5–50 ms instead: see Lock.)
func (b *Backend) pause(left time.Duration) time.Duration {
	d := notifyWaitMax*3/4 + rand.N(notifyWaitMax/4)
	if !b.listening.Load() {
		d = retryMin + rand.N(retryMax-retryMin)
	}
	if left > 0 {
		d = min(d, left+2*time.Millisecond+rand.N(5*time.Millisecond))
	}
	return d
}

// try makes one attempt, in one transaction under the key's advisory lock.
// A waiting writer's marker (if not "") is deleted by the transaction that
// grants it, so new readers are held back no longer than the wait.
// On ErrNotAcquired, left is the shortest lease among the conflicting
// holders (0 when unknown).
//
// A first grant whose caller is told no though its row may be committed
// (its COMMIT's outcome unknown, or its reply too late) is taken back by
// dropGrant, in the background; lost is that, for a waiting caller to
// wait for before it tries again. *redo are the fences of earlier such
// grants of the caller whose take-back failed: a retry drops them first,
// under the key's lock, and empties *redo once that commits.
func (b *Backend) try(ctx context.Context, req backends.LockRequest, marker string, how lockHow, redo *[]uint64) (lease backends.Lease, left time.Duration, lost *lostGrant, err error) {
	start := time.Now()
	caller := ctx
	ctx, cancel := b.op(ctx)
	defer cancel()
	if how != lockTry {
		// A first try waits for the key's advisory lock in the database,
		// holding a pooled connection: while another transaction holds
		// that lock (an instance stalled in a grant, up to op_timeout),
		// the LOCKs of a hot key would take the whole pool, and RENEWs and
		// UNLOCKs of other keys (a KEEPALIVE watchdog's among them) would
		// wait for a connection. One first try per key waits there; the
		// others wait here, in order, within their op_timeout. So does a
		// lockQueue retry (a herd of writers woken by one release would
		// otherwise hold the pool queued behind each other), which ends as
		// key busy if its turn does not come.
		release, err := b.enterGate(ctx, req.Key)
		if err != nil {
			if how == lockQueue && caller.Err() == nil {
				return backends.Lease{}, 0, nil, errKeyBusy
			}
			return backends.Lease{}, 0, nil, b.fail(caller, fmt.Errorf("waiting for this instance's try of the key before: %w", err))
		}
		defer release()
	}
	var act action
	var granted bool // a first hold was inserted: fence is its row's
	// A deadlock or serialization failure rolls the whole transaction
	// back (nothing was granted): it is run again within the same
	// deadline (rerun).
	err = b.rerun(ctx, opLock, func() (err error) {
		act, granted, lease, left, err = b.attempt(ctx, req, marker, how, start, redo)
		return err
	})
	if how == lockQueue && lockNotAvailable(err) && ctx.Err() == nil {
		// queueLockTimeout ran out (rolled back: nothing to take back).
		return backends.Lease{}, 0, nil, errKeyBusy
	}
	if errors.Is(err, errLate) {
		// Rolled back: nothing to take back.
		return backends.Lease{}, 0, nil, backends.ErrNotAcquired
	}
	if err != nil {
		if _, rolled := rolledBack(err); granted && !rolled {
			// The commit's outcome is unknown: drop the row if it is there,
			// as the caller is told the lock was not granted.
			lost = &lostGrant{fence: lease.Fence, done: b.dropGrant(req, lease.Fence)}
		}
		return backends.Lease{}, 0, lost, b.fail(caller, err)
	}
	switch act {
	case actKeyBusy:
		return backends.Lease{}, 0, nil, errKeyBusy
	case actBusy:
		return backends.Lease{}, left, nil, backends.ErrNotAcquired
	case actUpgrade:
		return backends.Lease{}, 0, nil, backends.ErrUpgrade
	}
	lease.At = time.Now()
	lease.Validity = validity(req.TTL, lease.At.Sub(start), b.cfg.DriftFactor, b.cfg.DriftMin)
	if lease.Validity < backends.MinValidity {
		// Too slow to be of use: the lease may already be over, so the
		// caller must not act on it (and under 1 ms would read as 0).
		// Take back what this call added.
		if granted {
			lost = &lostGrant{fence: lease.Fence, done: b.dropGrant(req, lease.Fence)}
		} else {
			b.dropReentry(req, lease.Fence)
		}
		return backends.Lease{}, 0, lost, backends.ErrNotAcquired
	}
	return lease, 0, nil, nil
}

// lostGrant is a first grant whose caller was told no though its row may
// be committed: its fence, and the answer of its take-back (dropGrant).
type lostGrant struct {
	fence uint64
	done  <-chan error
}

// attempt is one transaction of try under the key's advisory lock.
// With lockTry it does not wait for the key's advisory lock: busy, it
// ends with actKeyBusy (one more round trip, as what follows the lock may
// not run without it); with lockQueue it waits up to queueLockTimeout
// (the same round trip more), then fails with SQLSTATE 55P03.
// With *redo not empty (only on a retry, which tries the lock) it first
// drops one hold of the token's row of each fence (see try), and empties
// *redo once the transaction committed.
func (b *Backend) attempt(ctx context.Context, req backends.LockRequest, marker string, how lockHow, start time.Time, redo *[]uint64) (act action, granted bool, lease backends.Lease, left time.Duration, err error) {
	redone := false
	defer func() {
		if redone && err == nil {
			*redo = nil
		}
	}()
	err = pgx.BeginTxFunc(ctx, b.pool, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, func(tx pgx.Tx) error {
		batch := &pgx.Batch{}
		batch.Queue(b.idleTxSQL)
		lead := 2 // statements before the lazy DELETE
		if how != lockWait {
			pre := 1 // the SET LOCAL
			switch {
			case how == lockQueue:
				batch.Queue(fmt.Sprintf("SET LOCAL lock_timeout = %d", queueLockTimeout.Milliseconds()))
				pre++
				batch.Queue(b.n.queueLockKeySQL(), req.Key)
				batch.Queue("SET LOCAL lock_timeout TO DEFAULT")
			case req.Mode == backends.Read:
				batch.Queue(b.n.readerTryLockKeySQL(), req.Key, req.Token)
			default:
				batch.Queue(b.n.tryLockKeySQL(), req.Key)
			}
			locked, heldBack, err := readTryLock(tx.SendBatch(ctx, batch), pre)
			if err != nil {
				return err
			}
			if heldBack {
				act = actBusy
				return nil
			}
			if !locked {
				act = actKeyBusy
				return nil
			}
			for _, fence := range *redo {
				if _, err := tx.Exec(ctx, b.n.dropHoldSQL(), req.Key, req.Token, int16(req.Mode), int64(fence)); err != nil {
					return err
				}
				redone = true
			}
			batch, lead = &pgx.Batch{}, 0
		} else {
			batch.Queue(b.n.lockKeySQL(), req.Key)
		}
		batch.Queue(b.n.dropExpiredOfKeySQL(), req.Key)
		batch.Queue(b.n.heldRowsSQL(), req.Key)
		if req.Mode == backends.Read {
			batch.Queue(b.n.writerWaitsSQL(), req.Key)
		}
		rows, expired, writerWaits, err := readAttempt(tx.SendBatch(ctx, batch), lead, req.Mode == backends.Read)
		if err != nil {
			return err
		}
		act, left = decide(req, rows, writerWaits)
		ttl := ttlMS(req.TTL.Milliseconds())
		switch act {
		case actGrant:
			if len(expired.tokens) > 0 {
				// Rows that ran out after the lazy DELETE, judged expired
				// by the read and locked by it, go with this grant: left
				// in place, a backward step of the database's clock could
				// make one live again beside the new holder.
				if _, err := tx.Exec(ctx, b.n.dropRowsSQL(), req.Key, expired.tokens, expired.modes); err != nil {
					return err
				}
			}
			var fence int64
			if err := tx.QueryRow(ctx, b.n.grantSQL(), req.Key, req.Token, int16(req.Mode), ttl).Scan(&fence); err != nil {
				return err
			}
			lease = backends.Lease{Token: req.Token, Fence: uint64(fence), Holds: 1}
			granted = true
		case actReenter:
			var fence int64
			if err := tx.QueryRow(ctx, b.n.reenterSQL(), req.Key, req.Token, int16(req.Mode), ttl).Scan(&lease.Holds, &fence); err != nil {
				return err
			}
			lease.Token, lease.Fence = req.Token, uint64(fence)
		}
		if marker != "" && (act == actGrant || act == actReenter) {
			if _, err := tx.Exec(ctx, b.n.unmarkWriterNotifySQL(), req.Key, marker); err != nil {
				return err
			}
		}
		if (act == actGrant || act == actReenter) &&
			validity(req.TTL, time.Since(start), b.cfg.DriftFactor, b.cfg.DriftMin) < backends.MinValidity {
			// Already too late to be of use (the call waited for the key's
			// lock or a connection): roll back rather than commit a hold
			// to take back.
			return errLate
		}
		return nil
	})
	return act, granted, lease, left, err
}

// waitable reports an error a waiting LOCK waits through: the database
// could not decide (unreachable, restarting, a pooled connection it
// ended). A try whose COMMIT may have gone through is one: dropGrant
// takes one hold of its row back, also after a later try of the same
// token joined it.
func waitable(err error) bool {
	var nq *quorum.NoQuorumError
	return errors.As(err, &nq)
}

// errLate rolls back a grant that would reach its caller with no validity
// left (under backends.MinValidity).
var errLate = errors.New("postgres: grant too late to be of use")

// errKeyBusy is a retry that found the key's advisory lock taken: another
// transaction is deciding on the key, which may free it at once.
var errKeyBusy = fmt.Errorf("%w (the key's lock was taken)", backends.ErrNotAcquired)

// lockNotAvailable reports a lock wait that lock_timeout ended (SQLSTATE
// 55P03).
func lockNotAvailable(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "55P03"
}

// readTryLock reads a retry's first batch: pre SET LOCALs, whether the
// key's advisory lock was taken, and what follows.
func readTryLock(br pgx.BatchResults, pre int) (locked, heldBack bool, err error) {
	defer func() {
		if cerr := br.Close(); err == nil {
			err = cerr
		}
	}()
	for range pre {
		if _, err = br.Exec(); err != nil {
			return false, false, err
		}
	}
	var got *bool
	if err = br.QueryRow().Scan(&got); err != nil {
		return false, false, err
	}
	if got == nil {
		return false, true, nil // a reader behind a waiting writer
	}
	return *got, false, nil
}

// readAttempt reads the batch of try: lead statements (the SET LOCAL and
// the advisory lock, unless a first batch ran them), the lazy delete, the
// key's rows (the live ones kept) and (for readers) whether a writer
// waits.
func readAttempt(br pgx.BatchResults, lead int, readers bool) (rows []row, expired rowIDs, writerWaits bool, err error) {
	defer func() {
		if cerr := br.Close(); err == nil {
			err = cerr
		}
	}()
	for range lead + 1 { // the lead, the lazy DELETE
		if _, err = br.Exec(); err != nil {
			return nil, rowIDs{}, false, err
		}
	}
	rs, err := br.Query()
	if err != nil {
		return nil, rowIDs{}, false, err
	}
	rows, expired, err = scanHeldRows(rs)
	if err != nil {
		return nil, rowIDs{}, false, err
	}
	if readers {
		if err = br.QueryRow().Scan(&writerWaits); err != nil {
			return nil, rowIDs{}, false, err
		}
	}
	return rows, expired, writerWaits, nil
}

// rowIDs names rows of one key by token and mode, as two arrays for
// unnest.
type rowIDs struct {
	tokens []string
	modes  []int16
}

func scanRows(rs pgx.Rows) ([]row, error) {
	defer rs.Close()
	var out []row
	for rs.Next() {
		var r row
		var mode int16
		var fence, leftMS int64
		if err := rs.Scan(&r.token, &mode, &r.holds, &fence, &leftMS); err != nil {
			return nil, err
		}
		r.mode, r.fence, r.left = backends.Mode(mode), uint64(fence), time.Duration(leftMS)*time.Millisecond
		out = append(out, r)
	}
	return out, rs.Err()
}

// scanHeldRows reads heldRowsSQL's rows: the live ones, and which are
// expired.
func scanHeldRows(rs pgx.Rows) ([]row, rowIDs, error) {
	defer rs.Close()
	var out []row
	var expired rowIDs
	for rs.Next() {
		var r row
		var mode int16
		var fence, leftMS int64
		var live bool
		if err := rs.Scan(&r.token, &mode, &r.holds, &fence, &leftMS, &live); err != nil {
			return nil, rowIDs{}, err
		}
		if !live {
			expired.tokens = append(expired.tokens, r.token)
			expired.modes = append(expired.modes, mode)
			continue
		}
		r.mode, r.fence, r.left = backends.Mode(mode), uint64(fence), time.Duration(leftMS)*time.Millisecond
		out = append(out, r)
	}
	return out, expired, rs.Err()
}

// dropGrant deletes a row granted to a caller that was not told of it,
// on a goroutine of the backend's, bounded in time. It takes the key's
// advisory lock first and deletes in the statement after it: the grant's
// transaction holds that lock until it ends, and its COMMIT may still be
// running on the server when the caller gives up (a synchronous standby's
// wait, which pgx's cancel, sent over a new connection, ends committed).
// A DELETE sent at once saw the insert uncommitted, deleted nothing, and
// the row kept the key for its whole lease.
//
// The channel gets its answer (errClosed when the backend is closed;
// errTakeBackUnknown, wrapped, when its COMMIT failed: it may have been
// applied).
//
// A transaction rolled back before its COMMIT (a deadlock) is run again
// (rerun); one whose COMMIT failed never is: it may have taken the hold,
// and a second run would take one that a LOCK of the same token joined.
func (b *Backend) dropGrant(req backends.LockRequest, fence uint64) <-chan error {
	done := make(chan error, 1)
	started := b.background(func(ctx context.Context) (err error) {
		defer func() { done <- err }()
		return b.rerun(ctx, opTakeBack, func() error { return b.dropGrantTx(ctx, req, fence) })
	})
	if !started {
		done <- errClosed
	}
	return done
}

// dropGrantTx is one run of dropGrant's transaction.
func (b *Backend) dropGrantTx(ctx context.Context, req backends.LockRequest, fence uint64) error {
	tx, err := b.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(ctx) }() // after Commit: nothing
	if _, err := tx.Exec(ctx, b.idleTxSQL); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, b.n.lockKeySQL(), req.Key); err != nil {
		return err
	}
	// One hold, not the row: a LOCK of the same token may have joined
	// the row (a reentry) since, and was told it holds.
	if _, err := tx.Exec(ctx, b.n.dropHoldSQL(), req.Key, req.Token, int16(req.Mode), int64(fence)); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("%w: %w", errTakeBackUnknown, err)
	}
	return nil
}

// errTakeBackUnknown is a take-back (dropGrant) whose COMMIT failed: the
// database may have applied it.
var errTakeBackUnknown = errors.New("postgres: take-back's commit outcome unknown")

// dropReentry takes back the hold a reentrant grant added when its reply
// came too late to be of use, under the key's advisory lock, on a
// goroutine of the backend's, bounded in time. Best effort: on failure the
// token keeps one hold too many until its lease ends. The lease needs no
// restoring: a reentry never shortens it (reenterSQL).
func (b *Backend) dropReentry(req backends.LockRequest, fence uint64) {
	b.background(func(ctx context.Context) error {
		// Not under the key's advisory lock: queued behind grants, it
		// could come after the holder's UNLOCK and then had to take the
		// row's last hold, which it does (dropHoldSQL) in either order.
		// Run again when rolled back (rerun): at serializable it fails
		// whenever the holder's RENEW updated the row while it waited,
		// and the token would keep the hold its holder was not told of.
		return b.rerun(ctx, opTakeBack, func() error {
			_, err := b.pool.Exec(ctx, b.n.dropHoldSQL(), req.Key, req.Token, int16(req.Mode), int64(fence))
			return err
		})
	})
}

// op bounds one operation on the database by OpTimeout.
func (b *Backend) op(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, b.cfg.OpTimeout)
}

// markWriter records or refreshes a waiting writer's marker. Run again
// when rolled back (rerun): at serializable, its commit beside others
// that read and wrote the waiting writers (other waiters' markers set and
// removed, the sweep) fails now and then, and the writer went on waiting
// without its marker, new readers let in ahead of it, or answered
// -NOQUORUM … transaction rolled back if its WAIT ended then.
func (b *Backend) markWriter(ctx context.Context, key, marker string) error {
	octx, cancel := b.op(ctx)
	defer cancel()
	if err := b.rerun(octx, opMarkWriter, func() error {
		_, err := b.pool.Exec(octx, b.n.markWriterSQL(), key, marker, writerMarkTTL.Milliseconds())
		return err
	}); err != nil {
		return b.fail(ctx, err)
	}
	return nil
}

// unmarkWriter removes the marker of a writer that gave up waiting (or
// failed) and wakes the readers it held back, before Lock returns, bounded
// by OpTimeout even when the caller's context has ended. On failure the
// marker expires by itself within writerMarkTTL.
func (b *Backend) unmarkWriter(ctx context.Context, key, marker string) {
	// The removal runs on the backend's goroutine and LOCK waits for it
	// a short while only: readers are held back no longer than that in
	// the common case, and a slow database does not stretch a WAIT past
	// its deadline by one more op_timeout.
	done := make(chan struct{})
	b.background(func(bctx context.Context) error {
		defer close(done)
		// Run again when rolled back (rerun): left, the marker would hold
		// new readers back until it expires, behind no writer.
		if err := b.rerun(bctx, opUnmarkWriter, func() error {
			_, err := b.pool.Exec(bctx, b.n.unmarkWriterNotifySQL(), key, marker)
			return err
		}); err != nil {
			b.log.Debug("postgres: waiting writer's marker not removed; it expires by itself", zap.Error(err))
		}
		return nil
	})
	t := time.NewTimer(unmarkWait)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	case <-ctx.Done():
	}
}

// unmarkWait is how long a LOCK that gives up waits for its writer marker
// to go before it answers.
const unmarkWait = 250 * time.Millisecond

// background runs f with cleanupTimeout on a goroutine that Close waits
// for; a failure only leaves a row to expire by itself.
func (b *Backend) background(f func(ctx context.Context) error) (started bool) {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return false
	}
	b.bg.Add(1)
	b.mu.Unlock()
	go func() {
		defer b.bg.Done()
		ctx, cancel := context.WithTimeout(b.ctx, cleanupTimeout)
		defer cancel()
		if err := f(ctx); err != nil {
			b.log.Debug("postgres: cleanup failed; the row expires by itself", zap.Error(err))
		}
	}()
	return true
}

// Unlock implements backends.Backend.
func (b *Backend) Unlock(ctx context.Context, key, token string) (bool, error) {
	if err := b.usable(); err != nil {
		return false, err
	}
	octx, cancel := b.op(ctx)
	defer cancel()
	var before, notified int64
	err := b.rowStatement(octx, opRelease, b.text(key), func(noWait bool) error {
		q := b.n.releaseSQL()
		if noWait {
			q = b.n.releaseNoWaitSQL()
		}
		return b.pool.QueryRow(octx, q, b.text(key), b.text(token)).Scan(&before, &notified)
	})
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return false, nil
	case err != nil:
		return false, b.fail(ctx, err)
	}
	return true, nil
}

// Renew implements backends.Backend.
func (b *Backend) Renew(ctx context.Context, key, token string, ttl time.Duration) (time.Duration, error) {
	if err := b.usable(); err != nil {
		return 0, err
	}
	start := time.Now()
	octx, cancel := b.op(ctx)
	defer cancel()
	var tag pgconn.CommandTag
	err := b.rowStatement(octx, opRenew, b.text(key), func(noWait bool) (err error) {
		q := b.n.renewSQL()
		if noWait {
			q = b.n.renewNoWaitSQL()
		}
		tag, err = b.pool.Exec(octx, q, b.text(key), b.text(token), ttlMS(ttl.Milliseconds()))
		return err
	})
	if err != nil {
		return 0, b.fail(ctx, err)
	}
	if tag.RowsAffected() == 0 {
		return 0, nil
	}
	// A reply that comes after the lease it set ended (less the drift
	// allowance), or less than backends.MinValidity before, renews nothing the
	// caller may use: 0, as quorum.Extend reports.
	return renewed(validity(ttl, time.Since(start), b.cfg.DriftFactor, b.cfg.DriftMin)), nil
}

// renewed is what a renewal whose validity is v answers: v, or 0 (not
// renewed) when v is under backends.MinValidity.
func renewed(v time.Duration) time.Duration {
	if v < backends.MinValidity {
		return 0
	}
	return v
}

// UnlockHold implements backends.HoldKeeper: one hold of the token's row
// of mode (a downgraded token has a write row and a read row).
func (b *Backend) UnlockHold(ctx context.Context, key, token string, mode backends.Mode) (bool, error) {
	if err := b.usable(); err != nil {
		return false, err
	}
	octx, cancel := b.op(ctx)
	defer cancel()
	var before, notified int64
	err := b.rowStatement(octx, opRelease, b.text(key), func(noWait bool) error {
		q := b.n.releaseHoldSQL()
		if noWait {
			q = b.n.releaseHoldNoWaitSQL()
		}
		return b.pool.QueryRow(octx, q, b.text(key), b.text(token), int16(mode)).Scan(&before, &notified)
	})
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return false, nil
	case err != nil:
		return false, b.fail(ctx, fmt.Errorf("release of a %v hold: %w", mode, err))
	}
	return true, nil
}

// RenewHold implements backends.HoldKeeper: the token's row of mode is
// raised to ttl but never shortened, nor is a downgrade's other row
// (renewHoldSQL).
func (b *Backend) RenewHold(ctx context.Context, key, token string, mode backends.Mode, ttl time.Duration) (time.Duration, error) {
	if err := b.usable(); err != nil {
		return 0, err
	}
	start := time.Now()
	octx, cancel := b.op(ctx)
	defer cancel()
	var tag pgconn.CommandTag
	err := b.rowStatement(octx, opRenew, b.text(key), func(noWait bool) (err error) {
		q := b.n.renewHoldSQL()
		if noWait {
			q = b.n.renewHoldNoWaitSQL()
		}
		tag, err = b.pool.Exec(octx, q, b.text(key), b.text(token), int16(mode), ttlMS(ttl.Milliseconds()))
		return err
	})
	if err != nil {
		return 0, b.fail(ctx, fmt.Errorf("renewal of a %v hold: %w", mode, err))
	}
	if tag.RowsAffected() == 0 {
		return 0, nil
	}
	return renewed(validity(ttl, time.Since(start), b.cfg.DriftFactor, b.cfg.DriftMin)), nil
}

// Info implements backends.Backend. It reads without the key's lock: one
// statement sees one snapshot. At serializable, that read is rolled back
// (SQLSTATE 40001, "canceled on conflict out to pivot") now and then
// beside the key's grants, renewals and releases: it is run again (rerun).
func (b *Backend) Info(ctx context.Context, key string) (backends.LockInfo, bool, error) {
	if err := b.usable(); err != nil {
		return backends.LockInfo{}, false, err
	}
	key = b.text(key)
	octx, cancel := b.op(ctx)
	defer cancel()
	var rows []row
	var start time.Time // of the run whose rows are shown
	err := b.rerun(octx, opInfo, func() error {
		start = time.Now()
		rs, err := b.pool.Query(octx, b.n.liveHoldersSQL(), key)
		if err != nil {
			return err
		}
		rows, err = scanRows(rs)
		return err
	})
	if err != nil {
		return backends.LockInfo{}, false, b.fail(ctx, err)
	}
	// A lease left is shown as what its holder may still rely on, as a
	// grant's validity and RedLock's LOCKINFO are: less the time the
	// question took and the drift allowance for what is left, never
	// more than the holder was told.
	elapsed := time.Since(start)
	for i := range rows {
		rows[i].left = max(validity(rows[i].left, elapsed, b.cfg.DriftFactor, b.cfg.DriftMin), 0)
	}
	b.mu.Lock()
	waiting := b.byKey[key]
	b.mu.Unlock()
	info, ok := summarize(rows)
	info.Waiters = waiting
	return info, ok, nil
}

// summarize is LOCKINFO from a key's live rows: write mode when any write
// row lives (a downgraded token also holds a read row), the holders of that
// mode, the shortest lease among them, the largest fence.
func summarize(rows []row) (backends.LockInfo, bool) {
	if len(rows) == 0 {
		return backends.LockInfo{}, false
	}
	info := backends.LockInfo{Mode: backends.Read}
	for _, r := range rows {
		if r.mode == backends.Write {
			info.Mode = backends.Write
		}
		info.Fence = max(info.Fence, r.fence)
	}
	for _, r := range rows {
		if r.mode != info.Mode {
			continue
		}
		info.Holders = append(info.Holders, backends.Holder{Token: fromDBText(r.token), Holds: r.holds, TTL: r.left})
		if len(info.Holders) == 1 || r.left < info.TTL {
			info.TTL = r.left
		}
	}
	return info, true
}

// addWaiter registers a waiting Lock call before its first try, so no
// NOTIFY between a try and the wait is missed.
func (b *Backend) addWaiter(key string) *waiter {
	w := &waiter{key: key, tag: keyTag(key), wake: make(chan struct{}, 1)}
	b.mu.Lock()
	defer b.mu.Unlock()
	set := b.waiters[w.tag]
	if set == nil {
		set = map[*waiter]struct{}{}
		b.waiters[w.tag] = set
	}
	set[w] = struct{}{}
	b.byKey[key]++
	b.waiting++
	return w
}

func (b *Backend) removeWaiter(w *waiter) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if set := b.waiters[w.tag]; set != nil {
		delete(set, w)
		if len(set) == 0 {
			delete(b.waiters, w.tag)
		}
	}
	if b.byKey[w.key]--; b.byKey[w.key] <= 0 {
		delete(b.byKey, w.key)
	}
	b.waiting--
}

// wake tells the waiters of the key whose tag is tag ("" for all) to try
// again. It never blocks: a waiter already told once needs no second word.
func (b *Backend) wake(tag string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	poke := func(set map[*waiter]struct{}) {
		for w := range set {
			select {
			case w.wake <- struct{}{}:
			default:
			}
		}
	}
	if tag != "" {
		poke(b.waiters[tag])
		return
	}
	for _, set := range b.waiters {
		poke(set)
	}
}

// listen keeps one connection LISTENing on the release channel and wakes
// the waiters of each key notified. After a lost connection every waiter
// is woken, as releases may have gone unheard.
func (b *Backend) listen() {
	defer b.bg.Done()
	backoff := listenBackoffMin
	for b.ctx.Err() == nil {
		listened, err := b.listenOnce()
		b.listening.Store(false)
		if b.ctx.Err() != nil {
			return
		}
		b.log.Warn("postgres: listening connection lost; waiters poll until it is back", zap.Error(err))
		b.wake("")
		if !listened.IsZero() && time.Since(listened) > backoff {
			// The connection worked, for longer than the pause before
			// the next dial: the database is reachable again, and the
			// backoff, meant for one that stays unreachable, starts
			// over, or after a few losses over the process's life every
			// loss would leave waiters polling for 5 s.
			backoff = listenBackoffMin
		}
		t := time.NewTimer(backoff)
		select {
		case <-t.C:
		case <-b.ctx.Done():
			t.Stop()
			return
		}
		backoff = min(2*backoff, listenBackoffMax)
	}
}

// listenOnce dials the listening connection and serves it until it fails.
// listened is when its LISTEN went through (zero if it never did).
func (b *Backend) listenOnce() (listened time.Time, err error) {
	conn, err := pgx.ConnectConfig(b.ctx, b.pool.Config().ConnConfig.Copy())
	if err != nil {
		return time.Time{}, fmt.Errorf("dial: %w", err)
	}
	if err := checkClientEncoding(b.ctx, conn); err != nil {
		_ = conn.Close(b.ctx)
		return time.Time{}, err
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = conn.Close(ctx)
	}()
	// Bounded as any round trip: a link that stops delivering right after
	// the dial would keep the LISTEN waiting until the kernel gives up on
	// the connection (many minutes), not listening all that while, and
	// every waiter polling the database meanwhile.
	lctx, lcancel := context.WithTimeout(b.ctx, b.cfg.OpTimeout)
	err = b.rerun(lctx, opListen, func() error {
		_, err := conn.Exec(lctx, "LISTEN "+b.n.channelIdent)
		return err
	})
	lcancel()
	if err != nil {
		return time.Time{}, fmt.Errorf("LISTEN: %w", err)
	}
	listened = time.Now()
	b.listening.Store(true)
	b.wake("")
	for {
		wctx, cancel := context.WithTimeout(b.ctx, cmp.Or(b.cfg.ListenCheck, listenCheckEvery))
		n, err := conn.WaitForNotification(wctx)
		cancel()
		if err != nil && b.ctx.Err() == nil && pgconn.Timeout(err) {
			// Silence: the connection must still answer, or it is
			// redialed (a timeout leaves a pgx connection usable).
			pctx, pcancel := context.WithTimeout(b.ctx, b.cfg.OpTimeout)
			err = conn.Ping(pctx)
			pcancel()
			if err != nil {
				return listened, fmt.Errorf("the listening connection did not answer: %w", err)
			}
			continue
		}
		if err != nil {
			return listened, fmt.Errorf("waiting for a notification: %w", err)
		}
		b.wake(n.Payload)
	}
}

// sweep deletes expired rows every SweepInterval (jittered, so the
// lockproxies on one database spread their sweeps), in bounded batches.
func (b *Backend) sweep() {
	defer b.bg.Done()
	more := false
	for {
		d := b.cfg.SweepInterval/2 + rand.N(b.cfg.SweepInterval/2+1)
		if more {
			d = min(d, sweepCatchUp)
		}
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-b.ctx.Done():
			t.Stop()
			return
		}
		more = b.sweepPass()
	}
}

// sweepPass deletes the expired rows of both tables, at most sweepRounds
// batches of each, and reports whether one had more left.
func (b *Backend) sweepPass() (more bool) {
	for _, table := range []string{b.n.holds, b.n.waiters} {
		for r := range sweepRounds {
			n, err := b.sweepOnce(table)
			if err != nil {
				b.log.Debug("postgres: sweep failed", zap.String("table", table), zap.Error(err))
				break
			}
			b.swept.Add(n)
			if n < sweepBatch {
				break
			}
			if r == sweepRounds-1 {
				more = true
			}
		}
	}
	return more
}

// sweepOnce runs one batch's DELETE on table. At serializable, one run
// beside serializable transactions that read rows it deletes and write
// where it reads is rolled back, which would end the sweep's pass over
// the table: it is run again (rerun).
func (b *Backend) sweepOnce(table string) (n int64, err error) {
	ctx, cancel := context.WithTimeout(b.ctx, cleanupTimeout)
	defer cancel()
	var keys int64
	err = b.rerun(ctx, opSweep, func() error {
		return b.pool.QueryRow(ctx, b.n.sweepSQL(table), sweepBatch).Scan(&n, &keys)
	})
	return n, err
}

// Waiting is the number of LOCK calls waiting here (INFO's
// blocked_clients).
func (b *Backend) Waiting() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.waiting
}

// Addr is the database's host:port, as INFO lists it.
func (b *Backend) Addr() string { return b.addr }

// Wakeups is the number of waits ended early by a NOTIFY.
func (b *Backend) Wakeups() int64 { return b.wakeups.Load() }

// Swept is the number of expired rows the sweep deleted.
func (b *Backend) Swept() int64 { return b.swept.Load() }

func newID() string {
	var x [12]byte
	if _, err := crand.Read(x[:]); err != nil {
		panic("postgres: crypto/rand failed: " + err.Error())
	}
	return hex.EncodeToString(x[:])
}

var (
	_ backends.Backend    = (*Backend)(nil)
	_ backends.HoldKeeper = (*Backend)(nil)
)
