"""The client workload through redis-py (Debian's python3-redis): run with
HOST PORT MODE, MODE "workload" (the same results directly and through
lockproxy) or "lock" (lockproxy only). Prints one JSON object."""
import json
import sys
import threading
import time

import redis

host, port, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]


def conn():
    return redis.Redis(host=host, port=port, decode_responses=True, socket_timeout=10)


def workload():
    r = conn()
    out = {}
    out["set"] = r.set("s1", "hello")
    out["get"] = r.get("s1")
    out["incr"] = r.incr("n")
    out["incrby"] = r.incrby("n", 5)
    out["mget"] = r.mget("s1", "n", "missing")
    out["hset"] = r.hset("h", mapping={"f1": "v1", "f2": "v2"})
    out["hgetall"] = sorted(r.hgetall("h").items())
    out["hincrby"] = r.hincrby("h", "c", 3)
    out["rpush"] = r.rpush("l", "a", "b", "c")
    out["lrange"] = r.lrange("l", 0, -1)
    out["blpop_ready"] = list(r.blpop("l", 1))
    out["blpop_timeout"] = r.blpop("empty", 0.2)

    def push_later():
        time.sleep(0.2)
        conn().rpush("q", "woken")

    t = threading.Thread(target=push_later)
    t.start()
    out["blpop_woken"] = list(r.blpop("q", 5))
    t.join()

    with r.pipeline() as p:
        p.watch("w")
        p.multi()
        p.set("w", "1")
        p.incr("w")
        out["watch_ok"] = p.execute()
    with r.pipeline() as p:
        p.watch("w")
        conn().set("w", "changed")
        p.multi()
        p.set("w", "mine")
        try:
            p.execute()
            out["watch_conflict"] = "committed"
        except redis.WatchError:
            out["watch_conflict"] = "aborted"
    out["w"] = r.get("w")

    p = r.pipeline(transaction=False)
    for i in range(20):
        p.incr("pipelined")
    out["pipeline"] = p.execute()[-1]

    subs = []
    for _ in range(2):
        ps = conn().pubsub()
        ps.subscribe("ch")
        msg = ps.get_message(timeout=5)
        subs.append((ps, msg["type"] if msg else None))
    out["published"] = [r.publish("ch", m) for m in ("m1", "m2", "m3")]
    got = []
    for ps, first in subs:
        msgs = [first]
        deadline = time.time() + 5
        while len(msgs) < 4 and time.time() < deadline:
            m = ps.get_message(timeout=1)
            if m and m["type"] == "message":
                msgs.append(m["data"])
        ps.unsubscribe("ch")
        ps.close()
        got.append(msgs)
    out["subscribers"] = got

    script = "return redis.call('incrby', KEYS[1], ARGV[1])"
    out["eval"] = r.eval(script, 1, "ctr", 7)
    sha = r.script_load(script)
    out["evalsha"] = r.evalsha(sha, 1, "ctr", 7)
    out["after_pubsub"] = r.get("s1")
    return out


def lock():
    r = conn()
    out = {}
    g = r.execute_command("LOCK", "py:lock", "PX", 5000)
    d = dict(zip(g[0::2], g[1::2]))
    out["locked"] = d["validity_ms"] > 0
    out["held_again"] = r.execute_command("LOCK", "py:lock", "PX", 5000)
    out["unlock"] = r.execute_command("UNLOCK", "py:lock", d["token"])
    out["relayed_after"] = r.set("after-lock", "1")
    for name, args in (("reserved", ("SET", "lockproxy:x", "1")), ("denied", ("FLUSHALL",))):
        try:
            r.execute_command(*args)
            out[name] = "ok"
        except redis.ResponseError as e:
            out[name] = str(e)
    with r.pipeline() as p:
        p.multi()
        p.execute_command("LOCK", "py:lock2", "PX", 1000)
        try:
            p.execute()
            out["lock_in_multi"] = "ok"
        except redis.ResponseError as e:
            out["lock_in_multi"] = str(e)
    return out


print(json.dumps(workload() if mode == "workload" else lock(), sort_keys=True))
