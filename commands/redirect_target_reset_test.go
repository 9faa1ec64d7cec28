package commands

import (
	"strings"
	"testing"
	"time"
)

// TestRedirectTargetSurvivesReset: on Redis a tracking redirection
// names a client by id, and RESET keeps the client's id: the client named
// subscribes to __redis__:invalidate again after its RESET and gets the
// invalidations as before. Through lockproxy RESET closes the pinned
// connection the redirection was translated to (Pipe.Close), though the
// client is still connected and CLIENT ID still answers the id the
// tracking client redirected to: the invalidations go nowhere, and the
// tracking client's cache is never invalidated.
func TestRedirectTargetSurvivesReset(t *testing.T) {
	onRedisAndLockproxy(t, func(t *testing.T, _, addr, _ string) {
		inv, data, writer, id := dialRedirectTrio(t, addr, "rvreset:k")
		subscribeInvalidations(t, inv)
		trackRedirect(t, data, id)
		if got := inv.do(t, "RESET"); got != "+RESET" {
			t.Fatalf("RESET = %q", got)
		}
		if got := inv.do(t, "CLIENT ID"); got != ":"+id {
			t.Fatalf("CLIENT ID after RESET = %q; want :%s", got, id)
		}
		subscribeInvalidations(t, inv)
		if got := data.do(t, "GET rvreset:k"); got != "1" {
			t.Fatalf("GET = %q", got)
		}
		writer.do(t, "SET rvreset:k 2")
		_ = inv.c.SetReadDeadline(time.Now().Add(2 * time.Second))
		var got []string
		for range 5 {
			line, err := inv.rd.ReadString('\n')
			if err != nil {
				t.Fatalf("the subscriber got %q, then %v; want the invalidation of rvreset:k", got, err)
			}
			got = append(got, strings.TrimSuffix(line, "\r\n"))
		}
		if got[2] != "__redis__:invalidate" && !strings.Contains(strings.Join(got, " "), "invalidate") {
			t.Errorf("the subscriber got %q; want the invalidation of rvreset:k", got)
		}
	})
}
