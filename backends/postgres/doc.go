// Package postgres serves locks from one PostgreSQL database: one row per
// holder of a key in a holds table, fences from a SEQUENCE, expiry judged
// by the database's clock (clock_timestamp()) in the statements that look
// for conflicting holders, and waits woken early by LISTEN/NOTIFY.
//
// Mutual exclusion does not depend on lockproxy instances agreeing: every
// change to a key's holders runs in a transaction that first takes a
// transaction-scoped advisory lock on a hash of the key, so the
// transactions of all instances on one database that touch one key run one
// after another; each then reads the key's live holders (READ COMMITTED:
// every statement sees what the transactions before it committed, and the
// advisory lock was granted before the statement started) and inserts its
// hold only when none conflicts. A hash collision between two keys only
// serialises them; it never merges their holders.
package postgres
