package relay

import (
	"bytes"
	"context"
	"crypto/tls"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// commandEntry is one COMMAND reply entry in RESP2 with key specs (Redis
// 7), whose only key spec carries flags.
func commandEntry(name string, first, last, step int, specFlags ...string) string {
	var fl strings.Builder
	for _, f := range specFlags {
		fl.WriteString("+" + f + "\r\n")
	}
	spec := "*6\r\n$5\r\nflags\r\n*" + itoa(len(specFlags)) + "\r\n" + fl.String() +
		"$12\r\nbegin_search\r\n*0\r\n$9\r\nfind_keys\r\n*0\r\n"
	return "*10\r\n$" + itoa(len(name)) + "\r\n" + name + "\r\n:3\r\n*0\r\n:" + itoa(first) + "\r\n:" + itoa(last) + "\r\n:" + itoa(step) +
		"\r\n*1\r\n+@pubsub\r\n*0\r\n*1\r\n" + spec + "*0\r\n"
}

func itoa(n int) string {
	if n < 0 {
		return "-" + itoa(-n)
	}
	if n < 10 {
		return string(rune('0' + n))
	}
	return itoa(n/10) + string(rune('0'+n%10))
}

// TestParseSpecsNotKey: a command whose key specs all say not_key (the
// shard channel of SPUBLISH, SSUBSCRIBE, SUNSUBSCRIBE) has no key, as
// Redis's ACL sees it, although its legacy first/last/step name the
// channel; a command whose key spec is a key keeps its positions.
func TestParseSpecsNotKey(t *testing.T) {
	reply := "*3\r\n" + commandEntry("spublish", 1, 1, 1, "not_key") +
		commandEntry("ssubscribe", 1, -1, 1, "not_key") + commandEntry("get", 1, 1, 1, "RO", "access")
	ks := parseSpecs([]byte(reply))
	for name, want := range map[string]int{"spublish": 0, "ssubscribe": 0, "get": 1} {
		s, ok := ks[name]
		if !ok || s.first != want {
			t.Errorf("parseSpecs: %s = %+v (known %v); want first key %d", name, s, ok, want)
		}
	}
	r := New(Config{Addr: "127.0.0.1:1", KeyPrefix: "lockproxy:"})
	r.setSpecs(ks)
	if err := r.Check([]byte("spublish"), [][]byte{[]byte("spublish"), []byte("lockproxy:x"), []byte("m")}); err != nil {
		t.Errorf("SPUBLISH to a channel named like a lock key: %v; want relayed (a channel is no key)", err)
	}
}

// TestMigrateKeys: MIGRATE's keys are where Redis's migrateGetKeys finds
// them: the key at position 3, or, when it is the "" placeholder, those
// after a KEYS clause, which is looked for past the options' values.
func TestMigrateKeys(t *testing.T) {
	r := New(Config{Addr: "127.0.0.1:1"})
	r.setSpecs(keySpecs{}) // no dial: MIGRATE is special-cased by name
	for _, tc := range []struct {
		args string // space-separated; '' is the empty argument
		want []string
	}{
		{"migrate h 1 k 0 100", []string{"k"}},
		{"migrate h 1 k 0 100 COPY REPLACE", []string{"k"}},
		{"migrate h 1 '' 0 100 KEYS a b", []string{"a", "b"}},
		{"migrate h 1 '' 0 100 COPY KEYS a", []string{"a"}},
		{"migrate h 1 '' 0 100 AUTH keys KEYS a", []string{"a"}},
		{"migrate h 1 '' 0 100 AUTH2 keys keys KEYS a", []string{"a"}},
		{"migrate keys 1 k 0 100", []string{"k"}},
		{"migrate h 1 k 0 100 KEYS a", []string{"k", "a"}}, // Redis refuses it; checked either way
	} {
		t.Run(tc.args, func(t *testing.T) {
			var args [][]byte
			for _, a := range strings.Fields(tc.args) {
				if a == "''" {
					a = ""
				}
				args = append(args, []byte(a))
			}
			var got []string
			r.KeyWhere([]byte("migrate"), args, func(k []byte) bool {
				got = append(got, string(k))
				return false
			})
			if strings.Join(got, ",") != strings.Join(tc.want, ",") {
				t.Errorf("keys of %q = %q; want %q", tc.args, got, tc.want)
			}
		})
	}
}

// silentTLSUpstream listens on loopback and accepts connections that it
// never answers, as a plain-text Redis leaves a ClientHello unanswered.
func silentTLSUpstream(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		conns []net.Conn
	)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return ln.Addr().String()
}

// TestUnansweredTLSCostsOneDial: with TLS towards an upstream that never
// answers the handshake, a command fails within one dial_timeout, not one
// per dial made for it (the key table's in Check, then the client's slot
// in Collect), nor as many again because the backoff was counted from
// before the dial; and the error names the unanswered handshake.
func TestUnansweredTLSCostsOneDial(t *testing.T) {
	// Long enough that a loaded machine's delays (hundreds of ms) stay
	// well below a second dial's.
	const dialTimeout = time.Second
	r := New(Config{Addr: silentTLSUpstream(t), DialTimeout: dialTimeout, PoolSize: 4, KeyPrefix: "lockproxy:",
		TLS: &tls.Config{MinVersion: tls.VersionTLS12}})
	defer r.Close()
	for i := range 4 {
		p := r.NewPipe(int64(i+1), nil, nil) // a slot other than the key table's 0
		start := time.Now()
		get := [][]byte{[]byte("get"), []byte("k")}
		_ = r.Check([]byte("get"), get)
		p.Add(get)
		reply, err := p.Collect(context.Background(), 2, true)
		took := time.Since(start)
		if err != nil || !bytes.Contains(reply, []byte("upstream unavailable")) || !bytes.Contains(reply, []byte("no reply (is TLS enabled on this port?)")) {
			t.Fatalf("GET #%d = %q, %v; want upstream unavailable, the handshake unanswered", i, reply, err)
		}
		// A second dial would take a dial_timeout more: at least two in all.
		if took >= 2*dialTimeout {
			t.Errorf("GET #%d took %v; want at most about one dial_timeout (%v)", i, took, dialTimeout)
		}
		time.Sleep(60 * time.Millisecond) // past the first backoff, now and then
	}
	if attempts, failures := r.DialStats(); attempts != failures || attempts > 4 {
		t.Errorf("dials %d, failed %d; want at most one per command, all failed", attempts, failures)
	}
}
