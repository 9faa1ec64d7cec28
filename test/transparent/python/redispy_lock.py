"""redis-py's Lock (Debian's python3-redis), unmodified, through lockproxy's
transparent mode. Run by test/transparent (TestRedisPyLock):

    redispy_lock.py PROXY_PORT NODE_PORTS MODE

NODE_PORTS are the ports of the nodes that are up, comma-separated; the
script reads the lock keys on them directly. MODE is one of workflow,
counter, one-down, majority-down. Exits 0 and prints "ok" when every check
held."""

import sys
import threading
import time

import redis
from redis.exceptions import LockNotOwnedError, RedisError

PREFIX = "lockproxy:lock:"
TOTAL_NODES = 3
MAJORITY = TOTAL_NODES // 2 + 1

proxy_port = int(sys.argv[1])
node_ports = [int(p) for p in sys.argv[2].split(",") if p]
mode = sys.argv[3]

r = redis.Redis(host="127.0.0.1", port=proxy_port, socket_timeout=10)
nodes = [redis.Redis(host="127.0.0.1", port=p, socket_timeout=5) for p in node_ports]


def check(cond, what):
    if not cond:
        print("FAILED: " + what, flush=True)
        sys.exit(1)


def holding(name, token):
    return sum(1 for n in nodes if n.get(PREFIX + name) == token)


def present(name):
    return sum(n.exists(PREFIX + name) for n in nodes)


def gone(name):
    deadline = time.time() + 2
    while present(name) and time.time() < deadline:
        time.sleep(0.05)
    return present(name) == 0


def workflow():
    name = "lock:py"
    lock = r.lock(name, timeout=5)
    check(lock.acquire(blocking=False), "acquire")
    token = lock.local.token
    check(holding(name, token) >= MAJORITY, "key on a majority while held")
    check(lock.locked() and lock.owned(), "locked() and owned() while held")

    other = r.lock(name, timeout=5)
    check(not other.acquire(blocking=False), "a second holder is refused")
    check(not other.owned(), "the second holder does not own it")

    lock.extend(3)  # adds 3 s to what is left
    check(r.pttl(name) > 5000, "PTTL after extend(3) above 5 s, got %s" % r.pttl(name))
    lock.extend(2, replace_ttl=True)
    check(r.pttl(name) <= 2000, "PTTL after extend(2, replace_ttl=True) at most 2 s")
    lock.reacquire()
    check(4000 < r.pttl(name) <= 5000, "PTTL after reacquire() back to the timeout")

    lock.release()
    check(gone(name), "key on no node after release")
    check(not lock.locked(), "locked() after release")

    # Expiry: the lock runs out at its timeout and another client takes it;
    # the first holder's release then fails as it does on one Redis.
    first = r.lock(name, timeout=0.3)
    check(first.acquire(blocking=False), "acquire with a short timeout")
    time.sleep(0.6)
    check(not first.locked(), "expired")
    second = r.lock(name, timeout=5)
    check(second.acquire(blocking=False), "acquire after expiry")
    try:
        first.release()
        check(False, "release of an expired lock raises")
    except LockNotOwnedError:
        pass
    check(second.owned(), "the new holder still owns it")
    second.release()

    # Blocking acquire waits for a release by another holder.
    holder = r.lock(name, timeout=5, thread_local=False)  # released by a timer thread
    check(holder.acquire(blocking=False), "acquire before the blocking waiter")
    threading.Timer(0.2, holder.release).start()
    waiter = r.lock(name, timeout=5, sleep=0.02)
    check(waiter.acquire(blocking_timeout=5), "blocking acquire after the release")
    waiter.release()

    with r.lock(name, timeout=5, blocking_timeout=5) as ctx:
        check(ctx.owned(), "owned inside with")
    check(gone(name), "key on no node after with")


def counter(workers=4, iters=8):
    name = "lock:py:counter"
    state = {"n": 0, "inside": 0, "overlaps": 0}
    errors = []

    def work():
        try:
            lock = r.lock(name, timeout=5, sleep=0.005, blocking_timeout=20)
            for _ in range(iters):
                check(lock.acquire(), "acquire in a worker")
                state["inside"] += 1
                if state["inside"] > 1:
                    state["overlaps"] += 1
                v = state["n"]
                time.sleep(0.001)
                state["n"] = v + 1
                state["inside"] -= 1
                lock.release()
        except Exception as e:  # reported by the main thread
            errors.append(repr(e))

    threads = [threading.Thread(target=work) for _ in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    check(not errors, "workers failed: %s" % errors)
    check(state["n"] == workers * iters and state["overlaps"] == 0,
          "counter %d with %d overlaps; want %d" % (state["n"], state["overlaps"], workers * iters))


def one_down():
    name = "lock:py"
    lock = r.lock(name, timeout=5)
    check(lock.acquire(blocking_timeout=5), "acquire with one node down")
    check(holding(name, lock.local.token) >= MAJORITY, "key on a majority with one node down")
    lock.extend(1)
    lock.release()
    check(gone(name), "key on no node after release")


def majority_down():
    name = "lock:py"
    lock = r.lock(name, timeout=5)
    try:
        got = lock.acquire(blocking=False)
        check(False, "acquire with a majority down returned %r; want an error" % got)
    except RedisError:
        pass
    check(present(name) == 0, "no key left behind")


{"workflow": workflow, "counter": counter, "one-down": one_down, "majority-down": majority_down}[mode]()
print("ok", flush=True)
