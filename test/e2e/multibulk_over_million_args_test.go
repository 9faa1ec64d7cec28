package e2e

import (
	"bufio"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/test/harness"
	"github.com/lockproxy/lockproxy/test/lockclient"
)

// TestMultibulkOverMillionArgs: a relayed command of more than 1,048,576
// arguments (a DEL or MSET a cleanup job sends) runs through lockproxy as
// it runs on redis-server 7, whose multibulk cap is INT_MAX. lockproxy used
// to answer "-ERR Protocol error: invalid multibulk length" and close the
// connection. Checked against the upstream itself first, with the same
// bytes, on goroutines and on the event loop.
func TestMultibulkOverMillionArgs(t *testing.T) {
	cl := startCluster(t, 3)
	up := harness.StartRedis(t, harness.RedisOptions{})
	in := startInstance(t, cl.addrs(), "--upstream", up.Addr)
	for _, tc := range []struct {
		name string
		args int
	}{
		{"1,048,577 arguments", 1<<20 + 1},
		{"1,200,000 arguments", 1_200_000},
	} {
		b := []byte("*" + strconv.Itoa(tc.args) + "\r\n$3\r\nDEL\r\n")
		for i := 1; i < tc.args; i++ {
			b = append(b, "$1\r\nk\r\n"...)
		}
		b = append(b, "*1\r\n$4\r\nPING\r\n"...)
		for _, target := range []struct{ name, addr string }{{"redis-server", up.Addr}, {"lockproxy", in.addr}} {
			t.Run(tc.name+"/"+target.name, func(t *testing.T) {
				c, err := net.DialTimeout("tcp", target.addr, 5*time.Second)
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(30 * time.Second))
				// Replies are read while the command is written: the
				// server may answer (with an error) before it has all.
				replies := make(chan []lockclient.Reply, 1)
				go func() {
					br := bufio.NewReader(c)
					var got []lockclient.Reply
					for len(got) < 2 {
						r, err := lockclient.ReadReply(br)
						if err != nil {
							break
						}
						got = append(got, r)
					}
					replies <- got
				}()
				_, werr := c.Write(b)
				got := <-replies
				if len(got) != 2 || got[0].Kind != ':' || got[1].Kind != '+' || got[1].Str != "PONG" {
					t.Fatalf("DEL of %d arguments then PING = %v (write: %v); want an integer, then +PONG", tc.args-1, got, werr)
				}
			})
		}
	}
}
