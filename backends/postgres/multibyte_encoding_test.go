package postgres

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/backends"
)

// TestKeysInMultibyteEncodedDatabase: on a database in a multi-byte
// encoding other than UTF8 (EUC_JP), and on LATIN1 and SQL_ASCII ones, keys and tokens with
// non-ASCII characters lock, show in LOCKINFO and unlock as on a UTF8
// database, and a release wakes a waiter of such a key by its NOTIFY.
// The connections' client_encoding is the database's (pgx sets none), so
// the server read a key's UTF-8 bytes as EUC_JP: "注文:42" failed every
// LOCK with -ERR … invalid byte sequence (SQLSTATE 22021).
func TestKeysInMultibyteEncodedDatabase(t *testing.T) {
	for _, enc := range []string{"EUC_JP", "LATIN1", "SQL_ASCII"} {
		t.Run(enc, func(t *testing.T) { testKeysInEncoding(t, enc) })
	}
}

func testKeysInEncoding(t *testing.T, enc string) {
	pg, p := testDB(t)
	db := strings.TrimSuffix(p, "_") + "_db"
	dsn := newDatabase(t, pg, db, encodingOptions(enc))
	b := newDSNBackend(t, dsn, p)
	waitListening(t, b)
	ctx := context.Background()
	for _, tc := range []struct{ key, token string }{
		{"注文:42", "トークン"},
		{"clé", "jeton-é"},
		{"order:42", "plain"},
		{"bin\x00\xff", "tok\xfe"},
	} {
		l, err := b.Lock(ctx, backends.LockRequest{Key: tc.key, Token: tc.token, TTL: time.Minute})
		if err != nil {
			t.Errorf("%q: LOCK = %v", tc.key, err)
			continue
		}
		if l.Token != tc.token {
			t.Errorf("%q: LOCK token %q; want %q", tc.key, l.Token, tc.token)
		}
		info, held, err := b.Info(ctx, tc.key)
		if err != nil || !held || len(info.Holders) != 1 || info.Holders[0].Token != tc.token {
			t.Errorf("%q: LOCKINFO = %+v, held %v, %v; want held by %q", tc.key, info, held, err, tc.token)
		}
		wakeups := b.Wakeups()
		got := make(chan error, 1)
		go func() {
			_, err := b.Lock(ctx, backends.LockRequest{Key: tc.key, Token: "other", TTL: time.Minute, Wait: 10 * time.Second})
			got <- err
		}()
		for deadline := time.Now().Add(10 * time.Second); b.Waiting() == 0; time.Sleep(2 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%q: the waiter did not start", tc.key)
			}
		}
		time.Sleep(100 * time.Millisecond) // its first try refused, it sleeps until woken
		if ok, err := b.Unlock(ctx, tc.key, tc.token); !ok || err != nil {
			t.Errorf("%q: UNLOCK = %v, %v; want true", tc.key, ok, err)
		}
		select {
		case err := <-got:
			if err != nil {
				t.Errorf("%q: waiting LOCK = %v; want a grant", tc.key, err)
			}
		case <-time.After(15 * time.Second):
			t.Fatalf("%q: waiting LOCK not answered", tc.key)
		}
		if b.Wakeups() == wakeups {
			t.Errorf("%q: the waiter was not woken by the UNLOCK's NOTIFY", tc.key)
		}
		if ok, err := b.Unlock(ctx, tc.key, "other"); !ok || err != nil {
			t.Errorf("%q: UNLOCK of the waiter = %v, %v; want true", tc.key, ok, err)
		}
	}
}

// TestClientEncodingInDSNNotTwoHolders: two lockproxies on one database
// whose DSNs set different client_encodings (one leaves the database's)
// see a non-ASCII key as one key: the second is refused while the first
// holds it. Each connection's server read the key's bytes in its own
// client_encoding, so the two stored, locked and looked up two different
// keys and both were granted.
func TestClientEncodingInDSNNotTwoHolders(t *testing.T) {
	for _, tc := range []struct{ enc, dsnEnc string }{
		{"LATIN1", "UTF8"},
		{"UTF8", "LATIN1"},
		{"EUC_JP", "UTF8"},
	} {
		t.Run(tc.enc+"_"+tc.dsnEnc, func(t *testing.T) {
			pg, p := testDB(t)
			db := strings.TrimSuffix(p, "_") + "_db"
			dsn := newDatabase(t, pg, db, encodingOptions(tc.enc))
			bs := []*Backend{newDSNBackend(t, dsn, p), newDSNBackend(t, dsn+"&client_encoding="+tc.dsnEnc, p)}
			ctx := context.Background()
			for _, key := range []string{"clé", "Ãé"} {
				if _, err := bs[0].Lock(ctx, backends.LockRequest{Key: key, Token: "A", TTL: time.Minute}); err != nil {
					t.Fatalf("%q: LOCK through the first = %v", key, err)
				}
				if l, err := bs[1].Lock(ctx, backends.LockRequest{Key: key, Token: "B", TTL: time.Minute}); err == nil {
					t.Errorf("%q: LOCK through the second granted (fence %d) while the first holds it: two holders", key, l.Fence)
				}
				info, held, err := bs[1].Info(ctx, key)
				if err != nil || !held || len(info.Holders) != 1 || info.Holders[0].Token != "A" {
					t.Errorf("%q: LOCKINFO through the second = %+v, held %v, %v; want held by A", key, info, held, err)
				}
			}
		})
	}
}

// encodingOptions are CREATE DATABASE's options for a database in
// encoding enc (any encoding: the C locale and template0).
func encodingOptions(enc string) string {
	return fmt.Sprintf(` ENCODING '%s' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0`, enc)
}
