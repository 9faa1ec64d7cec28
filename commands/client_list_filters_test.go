package commands

import (
	"strings"
	"testing"
)

// TestClientListFiltersAsRedis: CLIENT LIST honours its TYPE and ID
// filters and refuses what Redis refuses, and CLIENT NO-EVICT and
// NO-TOUCH take only ON or OFF: redis-cli and client libraries (CLIENT
// LIST ID to look a connection up) get what redis-server gives them.
// Errors are compared with the upstream redis-server's own.
func TestClientListFiltersAsRedis(t *testing.T) {
	proxy, up := proxyWithUpstream(t, Options{})
	other := dialRaw(t, proxy)
	otherID := other.do(t, "CLIENT ID")[1:]
	if got := other.do(t, "CLIENT SETNAME other"); got != "+OK" {
		t.Fatalf("CLIENT SETNAME = %q", got)
	}
	sub := dialRaw(t, proxy)
	subID := sub.do(t, "CLIENT ID")[1:]
	if got := sub.do(t, "SUBSCRIBE ch"); got != "*3" {
		t.Fatalf("SUBSCRIBE = %q", got)
	}
	self := dialRaw(t, proxy)
	selfID := self.do(t, "CLIENT ID")[1:]
	upc := dialRaw(t, up)
	for _, tc := range []struct {
		cmd      string
		sameAsUp bool     // the reply must be the upstream's
		want     string   // else, when set: the reply
		wantIDs  []string // else: the reply lists exactly these ids, in order
		// wantField is a field the first line must have.
		wantField string
	}{
		{cmd: "CLIENT LIST ID " + otherID, wantIDs: []string{otherID}, wantField: "name=other"},
		{cmd: "CLIENT LIST ID " + selfID, wantIDs: []string{selfID}, wantField: "cmd=client|list"},
		{cmd: "CLIENT LIST id " + selfID + " " + otherID + " 999999", wantIDs: []string{selfID, otherID}},
		{cmd: "CLIENT LIST ID 999999", wantIDs: nil},
		{cmd: "CLIENT LIST TYPE pubsub", wantIDs: []string{subID}},
		{cmd: "CLIENT LIST type PUBSUB", wantIDs: []string{subID}},
		{cmd: "CLIENT LIST TYPE master", wantIDs: nil},
		{cmd: "CLIENT LIST TYPE replica", wantIDs: nil},
		{cmd: "CLIENT LIST TYPE slave", wantIDs: nil},
		{cmd: "CLIENT LIST ID abc", sameAsUp: true},
		{cmd: "CLIENT LIST ID 1 abc", sameAsUp: true},
		{cmd: "CLIENT LIST ID", sameAsUp: true},
		{cmd: "CLIENT LIST TYPE", sameAsUp: true},
		{cmd: "CLIENT LIST TYPE bogus", sameAsUp: true},
		{cmd: "CLIENT LIST TYPE normal extra", sameAsUp: true},
		{cmd: "CLIENT LIST foo", sameAsUp: true},
		{cmd: "CLIENT NO-EVICT maybe", sameAsUp: true},
		{cmd: "CLIENT NO-EVICT on", sameAsUp: true},
		{cmd: "CLIENT NO-EVICT OFF", sameAsUp: true},
		// The harness's redis-server may predate NO-TOUCH (7.2): Redis
		// 7.2 answers as it does for NO-EVICT.
		{cmd: "CLIENT NO-TOUCH maybe", want: "-ERR syntax error"},
		{cmd: "CLIENT NO-TOUCH On", want: "+OK"},
		{cmd: "CLIENT NO-TOUCH off", want: "+OK"},
	} {
		t.Run(tc.cmd, func(t *testing.T) {
			got := self.do(t, tc.cmd)
			if tc.sameAsUp {
				if want := upc.do(t, tc.cmd); got != want {
					t.Errorf("%s = %q; redis-server answers %q", tc.cmd, got, want)
				}
				return
			}
			if tc.want != "" {
				if got != tc.want {
					t.Errorf("%s = %q; want %q", tc.cmd, got, tc.want)
				}
				return
			}
			var ids []string
			for _, line := range strings.Split(strings.TrimSuffix(got, "\n"), "\n") {
				if line == "" {
					continue
				}
				id, _, _ := strings.Cut(strings.TrimPrefix(line, "id="), " ")
				ids = append(ids, id)
			}
			if strings.Join(ids, ",") != strings.Join(tc.wantIDs, ",") {
				t.Errorf("%s (self %s, other %s, subscribed %s) lists %v: %q; want %v", tc.cmd, selfID, otherID, subID, ids, got, tc.wantIDs)
			}
			if tc.wantField != "" && !strings.Contains(" "+strings.SplitN(got, "\n", 2)[0]+" ", " "+tc.wantField+" ") {
				t.Errorf("%s = %q; want %s in it", tc.cmd, got, tc.wantField)
			}
		})
	}
	// TYPE normal is every connection but the subscribed one.
	got := self.do(t, "CLIENT LIST TYPE normal")
	if strings.Contains(got, "id="+subID+" ") || !strings.Contains(got, "id="+selfID+" ") || !strings.Contains(got, "id="+otherID+" ") {
		t.Errorf("CLIENT LIST TYPE normal = %q; want %s and %s, not the subscribed %s", got, selfID, otherID, subID)
	}
}
