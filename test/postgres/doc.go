// Package postgres runs lockproxy with --backend postgres against real
// PostgreSQL servers that the tests start (initdb and postgres from
// Debian's postgresql package, on free loopback ports): the suite both
// other backends pass, fences across instances, NOTIFY wake-ups across
// instances, a killed and restarted database, the expiry sweep, a bad DSN,
// and a history check of many clients on two instances.
package postgres
