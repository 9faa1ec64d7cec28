package relay

import (
	"bytes"
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockproxy/lockproxy/test/harness"
)

// TestResetKeepsOnlyARedirectionsTarget: Pipe.Reset closes the pinned
// connection, as Close, unless a tracking redirection names it; that one
// is kept with its upstream id, in RESP2 and database 0 as RESET leaves a
// connection, signed in again. When the sign-in is refused (the upstream's
// password changed since the dial) it is closed after all: kept signed
// out, the client's next commands there would all get -NOAUTH.
func TestResetKeepsOnlyARedirectionsTarget(t *testing.T) {
	up := harness.StartRedis(t, harness.RedisOptions{Password: "one"})
	admin := up.Client(t)
	tests := []struct {
		name       string
		proto      int
		redirected bool
		newPass    bool // the upstream's password changes before the RESET
		wantKept   bool
	}{
		{name: "not a target", proto: 2, wantKept: false},
		{name: "target RESP2", proto: 2, redirected: true, wantKept: true},
		{name: "target RESP3", proto: 3, redirected: true, wantKept: true},
		{name: "target, sign-in refused", proto: 3, redirected: true, newPass: true, wantKept: false},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			r := New(Config{Addr: up.Addr, Password: "one", PoolSize: 2, DialTimeout: time.Second, ReadTimeout: 5 * time.Second})
			t.Cleanup(r.Close)
			client := int64(200 + i)
			p := r.NewPipe(client, nil, nil)
			defer p.Done()
			if err := p.Pin(ctx, tc.proto, 0); err != nil {
				t.Fatal(err)
			}
			p.Add([][]byte{[]byte("SELECT"), []byte("1")})
			if b, err := p.Collect(ctx, tc.proto, true); err != nil || string(b) != "+OK\r\n" {
				t.Fatalf("SELECT 1 = %q, %v", b, err)
			}
			p.SetPinnedDB(1)
			var id int64
			if tc.redirected {
				var err error
				if id, err = r.Named(client, NameRedirect); err != nil {
					t.Fatalf("Named = %v", err)
				}
			}
			if tc.newPass {
				if err := admin.ConfigSet(ctx, "requirepass", "two").Err(); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() {
					c := redis.NewClient(&redis.Options{Addr: up.Addr, Password: "two"})
					defer c.Close()
					_ = c.ConfigSet(context.Background(), "requirepass", "one").Err()
				})
			}
			start := time.Now()
			p.Reset(ctx)
			if took := time.Since(start); took > 2*time.Second {
				t.Errorf("Reset took %v; want one round trip (a refusal ends it, not the wait for an answer)", took.Round(time.Millisecond))
			}
			if p.Pinned() != tc.wantKept {
				t.Fatalf("after Reset the client is pinned: %v; want %v", p.Pinned(), tc.wantKept)
			}
			if !tc.wantKept {
				return
			}
			if p.pin.proto != 2 || p.pin.db != 0 {
				t.Errorf("the kept connection is RESP%d in database %d; want RESP2 in database 0", p.pin.proto, p.pin.db)
			}
			p.Add([][]byte{[]byte("CLIENT"), []byte("ID")})
			p.Add([][]byte{[]byte("CLIENT"), []byte("INFO")})
			b, err := p.Collect(ctx, 2, true)
			if err != nil {
				t.Fatal(err)
			}
			want := ":" + strconv.FormatInt(id, 10) + "\r\n"
			if len(b) < len(want) || string(b[:len(want)]) != want {
				t.Fatalf("CLIENT ID on the kept connection = %q; want %q first", b, want)
			}
			for _, field := range []string{" db=0 ", " user=default ", " flags=N ", " resp=2\n"} {
				if !bytes.Contains(b, []byte(field)) {
					t.Errorf("CLIENT INFO on the kept connection = %q; want %q (as RESET leaves it, signed in)", b[len(want):], field)
				}
			}
		})
	}
}
