package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// queryer is what checkIndexes reads through: the pool at start, the
// migration's transaction in it.
type queryer interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// indexSpec is one of the unique indexes the statements rely on.
type indexSpec struct {
	name, ident, table string // qualified, unqualified, the table qualified
	cols               int    // key columns
	last               string // the last column, a plain one
	swapped            string // the column that, put for "key" in the second column's expression, gives the first's; "" for none
	create             string // the statement making it
}

func (n names) indexSpecs() []indexSpec {
	s := n.schemaSQL()
	return []indexSpec{
		{name: n.holdsKey, ident: n.holdsKeyIdent, table: n.holds, cols: 3, last: "mode", swapped: "token", create: s[2]},
		{name: n.waitersKey, ident: n.waitersKeyIdent, table: n.waiters, cols: 2, last: "waiter", create: s[5]},
	}
}

// checkIndexes refuses a unique index that is there but is not the one
// the statements need. CREATE UNIQUE INDEX IF NOT EXISTS keeps whatever
// has the name: a unique index on other columns, a plain or partial or
// invalid one, even a table. Taken for the index, it would let start-up
// succeed (and an upgrade drop the earlier primary keys) while every
// grant fails (SQLSTATE 42P10: no arbiter for ON CONFLICT). An index not
// there yet is left to makeSchema, which checks again after creating it.
func (b *Backend) checkIndexes(ctx context.Context, q queryer) error {
	for _, ix := range b.n.indexSpecs() {
		var isIndex, onTable, unique, valid, immediate, whole, cols bool
		var def1, def2 string
		err := q.QueryRow(ctx, checkIndexSQL(), ix.name, ix.table, ix.cols, ix.last).
			Scan(&isIndex, &onTable, &unique, &valid, &immediate, &whole, &cols, &def1, &def2)
		if errors.Is(err, pgx.ErrNoRows) {
			continue // not there: makeSchema creates it
		}
		if err != nil {
			return fmt.Errorf("check the index %s: %w", ix.name, err)
		}
		var wrong string
		switch {
		case !isIndex:
			wrong = "is not an index"
		case !onTable:
			wrong = "is not on " + ix.table
		case !unique:
			wrong = "is not unique"
		case !valid:
			wrong = "is not valid (a CREATE INDEX CONCURRENTLY that failed leaves one so)"
		case !immediate:
			wrong = "is deferrable"
		case !whole:
			wrong = "is partial (it has a WHERE clause)"
		case !cols || ix.swapped != "" && def1 != strings.ReplaceAll(def2, ix.swapped, "key"):
			wrong = "has other columns, or the same in another order"
		}
		if wrong == "" {
			arbiters, err := indexArbiters(ctx, q, b.n.arbiterProbeSQL(ix.table))
			if err != nil {
				return fmt.Errorf("check the index %s: %w", ix.name, err)
			}
			if !slices.Contains(arbiters, unq(ix.name)) {
				wrong = "is not on the columns the statements' ON CONFLICT names"
			}
		}
		if wrong != "" {
			return &unfitIndexError{index: ix.name, wrong: wrong, create: ix.create}
		}
	}
	return nil
}

// unfitIndexError is an index checkIndexes refused: what is wrong with
// it and what it must be.
type unfitIndexError struct{ index, wrong, create string }

func (e *unfitIndexError) Error() string {
	return fmt.Sprintf("postgres: the index %s %s; the lock statements need it as `%s`: drop or rename it and start again (lockproxy then creates it)",
		e.index, e.wrong, e.create)
}

// indexArbiters is the names of the indexes the planner takes as the
// arbiters of the ON CONFLICT of statement sql (planned, not run). It
// matches the index's expressions with the statement's as the grants
// need, however PostgreSQL would print them.
func indexArbiters(ctx context.Context, q queryer, sql string) ([]string, error) {
	var plan string
	if err := q.QueryRow(ctx, `EXPLAIN (FORMAT JSON) `+sql).Scan(&plan); err != nil {
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == "42P10" {
			return nil, nil // no index at all fits the ON CONFLICT
		}
		return nil, fmt.Errorf("plan the ON CONFLICT statement: %w", err)
	}
	var p []struct {
		Plan struct {
			Arbiters []string `json:"Conflict Arbiter Indexes"`
		}
	}
	if err := json.Unmarshal([]byte(plan), &p); err != nil || len(p) != 1 {
		return nil, fmt.Errorf("read the ON CONFLICT statement's plan %q: %v", plan, err)
	}
	return p[0].Plan.Arbiters, nil
}

// addKeys gives each table its surrogate primary key (see schemaSQL),
// dropping an earlier one first (an earlier version's on the whole key).
// In makeSchema's transaction, after checkIndexes: the tables are never
// left without the unique indexes.
func (b *Backend) addKeys(ctx context.Context, tx pgx.Tx) error {
	q, args := b.n.keysSQL()
	rs, err := tx.Query(ctx, q, args...)
	if err != nil {
		return fmt.Errorf("read the tables' primary keys: %w", err)
	}
	type tableKeys struct {
		table, drop               string
		keyed, haveID, idIdentity bool
	}
	var tabs []tableKeys
	var t tableKeys
	if _, err := pgx.ForEachRow(rs, []any{&t.table, &t.drop, &t.keyed, &t.haveID, &t.idIdentity}, func() error {
		tabs = append(tabs, t)
		return nil
	}); err != nil {
		return fmt.Errorf("read the tables' primary keys: %w", err)
	}
	for _, t := range tabs {
		if t.keyed {
			continue
		}
		if t.haveID && !t.idIdentity {
			return fmt.Errorf("%s has a column id that is not an identity column, where lockproxy's primary key goes: rename or drop it", t.table)
		}
		if t.drop != "" {
			if _, err := tx.Exec(ctx, dropKeySQL(t.table, t.drop)); err != nil {
				return fmt.Errorf("drop the primary key %s of %s: %w", t.drop, t.table, err)
			}
		}
		if _, err := tx.Exec(ctx, addKeySQL(t.table, t.haveID)); err != nil {
			return fmt.Errorf("add the primary key id to %s: %w", t.table, err)
		}
	}
	return nil
}
