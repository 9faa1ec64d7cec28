"""redis-py's documented optimistic transaction (pipeline watch, get,
multi, delete or pexpire, execute; WatchError when the watched key
changed) on a lock key, through lockproxy's transparent mode. Run by
test/transparent (TestRedisPyWatchTransaction):

    redispy_watch.py PROXY_PORT NODE_PORTS

Exits 0 and prints "ok" when every check held."""

import sys
import time

import redis
from redis.exceptions import WatchError

PREFIX = "lockproxy:lock:"

proxy_port = int(sys.argv[1])
node_ports = [int(p) for p in sys.argv[2].split(",") if p]

r = redis.Redis(host="127.0.0.1", port=proxy_port, socket_timeout=10)
other = redis.Redis(host="127.0.0.1", port=proxy_port, socket_timeout=10)
nodes = [redis.Redis(host="127.0.0.1", port=p, socket_timeout=5) for p in node_ports]


def check(cond, what):
    if not cond:
        print("FAIL:", what)
        sys.exit(1)


def on_nodes(key, value):
    """How many nodes hold value at key's lock key."""
    return sum(1 for n in nodes if n.get(PREFIX + key) == value)


def present(key):
    return sum(n.exists(PREFIX + key) for n in nodes)


def settle(key, want, value=None):
    """Wait up to 2 s for key's lock key to be on want nodes (with value)."""
    deadline = time.time() + 2
    while True:
        got = on_nodes(key, value) if value is not None else present(key)
        if got == want or time.time() > deadline:
            return got
        time.sleep(0.02)


def compare_and(key, token, what, between=None):
    """redis-py's documented pattern; returns execute()'s result."""
    with r.pipeline() as pipe:
        pipe.watch(key)
        check(pipe.get(key) == token, "GET in the watch of " + key)
        if between:
            between()
        pipe.multi()
        what(pipe)
        return pipe.execute()


key = "lock:py:watch"
check(r.set(key, b"tok", nx=True, px=10000), "SET NX PX")
check(settle(key, len(nodes), b"tok") == len(nodes), "the lock on every node")

res = compare_and(key, b"tok", lambda p: p.pexpire(key, 30000))
check(res == [True], "extend: execute() = %r" % (res,))
for n in nodes:
    check(n.pttl(PREFIX + key) > 20000, "extended on every node")

res = compare_and(key, b"tok", lambda p: p.delete(key))
check(res == [1], "release: execute() = %r" % (res,))
check(settle(key, 0) == 0, "released on every node")


def take_over():
    for n in nodes:
        n.delete(PREFIX + key)
    check(other.set(key, b"theirs", nx=True, px=20000), "the other client's SET NX PX")
    check(settle(key, len(nodes), b"theirs") == len(nodes), "the other's lock on every node")


check(r.set(key, b"tok", nx=True, px=10000), "SET NX PX again")
# On every node before take_over deletes it there: a grant is answered
# once a majority holds it, and a write still on its way to the last node
# landing after take_over's DEL would keep the other's SET NX off it.
check(settle(key, len(nodes), b"tok") == len(nodes), "the lock on every node again")
try:
    compare_and(key, b"tok", lambda p: p.delete(key), between=take_over)
    check(False, "no WatchError after the lock was taken over")
except WatchError:
    pass
check(on_nodes(key, b"theirs") == len(nodes), "the other's lock intact on every node")
# The pipeline's connection went back to the pool and works.
check(r.get(key) == b"theirs", "GET after the failed transaction")
print("ok")
