package zookeeper

import (
	"strings"
	"testing"
	"time"
)

// TestNodeStatesNamesServerByHostname: INFO's lockproxy_node<i> line of the
// server the session is on says state=ok also when the server is
// configured by host name (zk1:2181, the usual case), not only by IP
// address. go-zookeeper names the server it is on by the address it
// resolved the name to; before, no server was ever ok (or disconnected):
// each read standby.
func TestNodeStatesNamesServerByHostname(t *testing.T) {
	root := testRoot(t)
	port := zkAddr[strings.LastIndexByte(zkAddr, ':')+1:]
	for _, tc := range []struct {
		name    string
		servers []string
		want    []string
	}{
		{"address", []string{zkAddr}, []string{"addr=" + zkAddr + ",state=ok"}},
		{"host name", []string{"localhost:" + port}, []string{"addr=localhost:" + port + ",state=ok"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newBackend(t, tc.servers, root, 10*time.Second)
			if got := b.NodeStates(); strings.Join(got, " ") != strings.Join(tc.want, " ") {
				t.Errorf("NodeStates with servers %q = %q; want %q", tc.servers, got, tc.want)
			}
		})
	}
}
