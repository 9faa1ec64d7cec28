package postgres

import (
	"testing"

	"github.com/lockproxy/lockproxy/test/lockclient"
)

// TestTransparentSetNXOnReadHeldKey: in transparent mode SET key value NX
// PX on a lock key that is held answers nil, as Redis answers a SET NX on
// a key that exists, whoever holds it. When the value is the token of a
// read holder (RLOCK … TOKEN v, then SET key v NX PX), the backend's
// refused upgrade must read as "not set" too, not as an internal error.
func TestTransparentSetNXOnReadHeldKey(t *testing.T) {
	prefix := newPrefix()
	a := startInstance(t, shared.DSN(), prefix, "LOCKPROXY_LOCK_PATTERNS=lock:*")
	rc := lc.DialRaw(t, a.addr)
	for _, tc := range []struct {
		name  string
		setup []string // run first; %k is the key
		value string
	}{
		{"write-held by another value", []string{"SET", "%k", "w1", "NX", "PX", "10000"}, "v"},
		{"write-held by the same value", []string{"SET", "%k", "v", "NX", "PX", "10000"}, "v"},
		{"read-held by another token", []string{"RLOCK", "%k", "PX", "10000", "TOKEN", "r1"}, "v"},
		{"read-held by the same token", []string{"RLOCK", "%k", "PX", "10000", "TOKEN", "v"}, "v"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := "lock:" + lockclient.RandID()
			setup := append([]string(nil), tc.setup...)
			setup[1] = key
			if r := rc.Do(setup...); r.Kind == '-' || r.Null {
				t.Fatalf("%q = %v", setup, r)
			}
			if r := rc.Do("SET", key, tc.value, "NX", "PX", "10000"); !r.Null {
				t.Errorf("SET %s %s NX PX 10000 on a held key = %v; want nil, as Redis", key, tc.value, r)
			}
		})
	}
}
