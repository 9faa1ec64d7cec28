package relay

import (
	"context"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/test/harness"
)

// TestUnredirectTakesBackOneRedirection: a CLIENT TRACKING on … REDIRECT
// that Redis refuses takes its mark on the target's connection back
// (Unredirect), and only its own: a redirection Redis accepted, from
// another client, still keeps the target's connection (a flag cleared
// by the refusal would let the target give it back, and the accepted
// redirection's invalidations would go to a closed connection). An
// Unredirect naming a connection the client no longer has changes
// nothing on the one it has.
func TestUnredirectTakesBackOneRedirection(t *testing.T) {
	up := harness.StartRedis(t, harness.RedisOptions{})
	tests := []struct {
		name       string
		redirects  int  // Named(…, NameRedirect) calls
		taken      int  // Unredirect calls with the id Named answered
		staleID    bool // one more Unredirect, with another connection's id
		wantTarget bool
	}{
		{name: "refused alone", redirects: 1, taken: 1, wantTarget: false},
		{name: "refused beside an accepted one", redirects: 2, taken: 1, wantTarget: true},
		{name: "accepted", redirects: 1, wantTarget: true},
		{name: "taken back more often than named", redirects: 1, taken: 2, wantTarget: false},
		{name: "another connection's id", redirects: 1, staleID: true, wantTarget: true},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := New(Config{Addr: up.Addr, PoolSize: 2, DialTimeout: time.Second, ReadTimeout: 5 * time.Second})
			t.Cleanup(r.Close)
			client := int64(100 + i)
			p := r.NewPipe(client, nil, nil)
			defer p.Done()
			if err := p.Pin(context.Background(), 2, 0); err != nil {
				t.Fatal(err)
			}
			var id int64
			for range tc.redirects {
				var err error
				if id, err = r.Named(client, NameRedirect); err != nil {
					t.Fatalf("Named = %v", err)
				}
			}
			for range tc.taken {
				r.Unredirect(client, id)
			}
			if tc.staleID {
				r.Unredirect(client, id+1000)
			}
			if got := p.RedirectTarget(); got != tc.wantTarget {
				t.Errorf("RedirectTarget = %v; want %v", got, tc.wantTarget)
			}
			if !tc.wantTarget {
				// The count did not go below 0: a redirection named now
				// counts.
				if _, err := r.Named(client, NameRedirect); err != nil {
					t.Fatalf("Named = %v", err)
				}
				if !p.RedirectTarget() {
					t.Error("a redirection named after the mark was taken back does not count")
				}
				r.Unredirect(client, id)
			}
			// What the client's clean unpin then does with its connection.
			p.Unpin(true)
			if p.Pinned() != tc.wantTarget {
				t.Errorf("after a clean Unpin the client is pinned: %v; want %v", p.Pinned(), tc.wantTarget)
			}
		})
	}
}
