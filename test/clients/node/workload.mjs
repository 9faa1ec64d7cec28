// The client workload through ioredis or node-redis (npm): run with
// LIB (ioredis|node-redis) PROTO (2|3) HOST PORT MODE (workload|lock).
// Prints one JSON object; "workload" results must be the same directly
// against Redis and through lockproxy.
import Redis from 'ioredis';
import { createClient } from 'redis';

const [lib, protoArg, host, portArg, mode] = process.argv.slice(2);
const proto = Number(protoArg);
const port = Number(portArg);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// norm turns maps, objects and buffers into plain sorted JSON.
function norm(v) {
  if (v === undefined) return null;
  if (v instanceof Map) return [...v.entries()].map(([k, x]) => [String(k), norm(x)]).sort();
  if (Buffer.isBuffer(v)) return v.toString();
  if (Array.isArray(v)) return v.map(norm);
  if (v && typeof v === 'object') return Object.entries(v).map(([k, x]) => [k, norm(x)]).sort();
  return v;
}

async function connect() {
  if (lib === 'ioredis') {
    const opts = { host, port, maxRetriesPerRequest: 1, lazyConnect: true };
    if (proto === 3) opts.protocol = 3;
    const c = new Redis(opts);
    await c.connect();
    return c;
  }
  const c = createClient({ socket: { host, port, reconnectStrategy: false }, RESP: proto });
  c.on('error', () => {});
  await c.connect();
  return c;
}

// call runs a command through the library's generic call.
async function call(c, ...args) {
  if (lib === 'ioredis') return c.call(...args);
  return c.sendCommand(args.map(String));
}

async function close(c) {
  if (lib === 'ioredis') c.disconnect();
  else await c.close();
}

async function subscribe(channel, got) {
  const c = await connect();
  if (lib === 'ioredis') {
    c.on('message', (ch, m) => got.push(m));
    await c.subscribe(channel);
  } else {
    await c.subscribe(channel, (m) => got.push(m));
  }
  return c;
}

async function workload() {
  const r = await connect();
  const io = lib === 'ioredis';
  const out = {};
  out.set = await r.set('s1', 'hello');
  out.get = await r.get('s1');
  out.incr = await r.incr('n');
  out.incrby = io ? await r.incrby('n', 5) : await r.incrBy('n', 5);
  out.mget = io ? await r.mget('s1', 'n', 'missing') : await r.mGet(['s1', 'n', 'missing']);
  out.hset = io ? await r.hset('h', { f1: 'v1', f2: 'v2' }) : await r.hSet('h', { f1: 'v1', f2: 'v2' });
  out.hgetall = norm(io ? await r.hgetall('h') : await r.hGetAll('h'));
  out.hincrby = io ? await r.hincrby('h', 'c', 3) : await r.hIncrBy('h', 'c', 3);
  out.rpush = io ? await r.rpush('l', 'a', 'b', 'c') : await r.rPush('l', ['a', 'b', 'c']);
  out.lrange = io ? await r.lrange('l', 0, -1) : await r.lRange('l', 0, -1);
  const blpop = async (c, key, t) => {
    const v = io ? await c.blpop(key, t) : await c.blPop(key, t);
    return v && !Array.isArray(v) ? [v.key, v.element] : norm(v);
  };
  out.blpop_ready = await blpop(r, 'l', 1);
  out.blpop_timeout = await blpop(r, 'empty', 0.2);
  const other = await connect();
  const pushed = sleep(200).then(() => (io ? other.rpush('q', 'woken') : other.rPush('q', 'woken')));
  out.blpop_woken = await blpop(r, 'q', 5);
  await pushed;

  // A transaction with WATCH, then one that another client breaks.
  const w = await connect();
  await w.watch('w');
  out.watch_ok = norm(await w.multi().set('w', '1').incr('w').exec());
  await w.watch('w');
  await other.set('w', 'changed');
  try {
    const res = await w.multi().set('w', 'mine').exec();
    out.watch_conflict = res === null ? 'aborted' : 'committed';
  } catch (e) {
    out.watch_conflict = 'aborted';
  }
  out.w = await r.get('w');

  // Pipelining: 20 commands sent together.
  const ps = [];
  for (let i = 0; i < 20; i++) ps.push(r.incr('pipelined'));
  out.pipeline = (await Promise.all(ps))[19];

  const got = [[], []];
  const subs = [await subscribe('ch', got[0]), await subscribe('ch', got[1])];
  out.published = [];
  for (const m of ['m1', 'm2', 'm3']) out.published.push(await r.publish('ch', m));
  for (let i = 0; i < 100 && (got[0].length < 3 || got[1].length < 3); i++) await sleep(50);
  out.subscribers = got;
  for (const s of subs) await close(s);

  const script = "return redis.call('incrby', KEYS[1], ARGV[1])";
  out.eval = io ? await r.eval(script, 1, 'ctr', 7) : await r.eval(script, { keys: ['ctr'], arguments: ['7'] });
  const sha = io ? await r.script('LOAD', script) : await r.scriptLoad(script);
  out.evalsha = io ? await r.evalsha(sha, 1, 'ctr', 7) : await r.evalSha(sha, { keys: ['ctr'], arguments: ['7'] });
  out.after_pubsub = await r.get('s1');
  for (const c of [r, other, w]) await close(c);
  return out;
}

async function lock() {
  const r = await connect();
  const out = {};
  const g = norm(await call(r, 'LOCK', 'node:lock', 'PX', 5000));
  const d = Object.fromEntries(Array.isArray(g[0]) ? g : g.reduce((a, x, i) => (i % 2 ? a : [...a, [x, g[i + 1]]]), []));
  out.locked = d.validity_ms > 0;
  out.held_again = norm(await call(r, 'LOCK', 'node:lock', 'PX', 5000));
  out.unlock = await call(r, 'UNLOCK', 'node:lock', d.token);
  out.relayed_after = await r.set('after-lock', '1');
  for (const [name, args] of [['reserved', ['SET', 'lockproxy:x', '1']], ['denied', ['FLUSHALL']]]) {
    try {
      await call(r, ...args);
      out[name] = 'ok';
    } catch (e) {
      out[name] = String(e.message);
    }
  }
  await close(r);
  return out;
}

const timer = setTimeout(() => { console.error('timed out'); process.exit(3); }, 30000);
const out = mode === 'lock' ? await lock() : await workload();
console.log(JSON.stringify(out, Object.keys(out).sort()));
clearTimeout(timer);
process.exit(0);
