// redis-semaphore's Mutex on ioredis, unmodified, through lockproxy's
// transparent mode. Run by test/transparent (TestRedisSemaphoreIORedis):
//
//   node semaphore_lock.js PROXY_PORT NODE_PORTS MODE
//
// NODE_PORTS are the ports of the nodes that are up, comma-separated; the
// script reads the lock keys on them directly. MODE is one of workflow,
// counter, one-down, majority-down. Exits 0 and prints "ok" when every
// check held.
'use strict';

const Redis = require('ioredis');
const { Mutex } = require('redis-semaphore');

const PREFIX = 'lockproxy:lock:';
const MAJORITY = 2; // of 3 nodes

const [proxyPort, nodeList, mode] = process.argv.slice(2);
const nodePorts = nodeList.split(',').filter(Boolean).map(Number);

// ioredis's defaults but for giving up on a dead server instead of
// reconnecting forever (this is a test that must end).
const opts = { host: '127.0.0.1', maxRetriesPerRequest: 1, retryStrategy: () => null };
const r = new Redis({ ...opts, port: Number(proxyPort) });
const nodes = nodePorts.map((port) => new Redis({ ...opts, port }));

function check(cond, what) {
  if (!cond) {
    console.log('FAILED: ' + what);
    process.exit(1);
  }
}

const sleep = (ms) => new Promise((res) => setTimeout(res, ms));

async function holding(key, value) {
  let n = 0;
  for (const c of nodes) if ((await c.get(PREFIX + key)) === value) n++;
  return n;
}

async function present(key) {
  let n = 0;
  for (const c of nodes) n += await c.exists(PREFIX + key);
  return n;
}

async function gone(key) {
  const deadline = Date.now() + 2000;
  while ((await present(key)) > 0 && Date.now() < deadline) await sleep(50);
  return (await present(key)) === 0;
}

async function workflow() {
  const key = 'mutex:js';
  let lost = 0;
  const m = new Mutex(r, 'js', { lockTimeout: 1000, refreshInterval: 200, acquireTimeout: 5000, onLockLost: () => lost++ });
  check(await m.tryAcquire(), 'acquire');
  check((await holding(key, m.identifier)) >= MAJORITY, 'key on a majority while held');

  const other = new Mutex(r, 'js', { lockTimeout: 1000, acquireAttemptsLimit: 1, refreshInterval: 0 });
  check(!(await other.tryAcquire()), 'a second holder is refused');

  // Held past its lockTimeout: the library's refresh keeps it.
  await sleep(1500);
  check(lost === 0 && m.isAcquired, 'still held after the refreshes');
  check((await holding(key, m.identifier)) >= MAJORITY, 'key on a majority after the refreshes');
  const pttl = await r.pttl(key);
  check(pttl > 0 && pttl <= 1000, 'PTTL through lockproxy within the lockTimeout, got ' + pttl);

  await m.release();
  check(await gone(key), 'key on no node after release');

  // Expiry: a holder that stops refreshing loses the lock at its timeout.
  const first = new Mutex(r, 'js', { lockTimeout: 300, refreshInterval: 0 });
  check(await first.tryAcquire(), 'acquire without refresh');
  await sleep(600);
  const second = new Mutex(r, 'js', { lockTimeout: 5000, refreshInterval: 0 });
  check(await second.tryAcquire(), 'acquire after expiry');
  await first.release(); // compare-and-delete: leaves the new holder alone
  check((await holding(key, second.identifier)) >= MAJORITY, 'the old holder\'s release left the new holder');

  // A blocking acquire waits for the release.
  setTimeout(() => second.release(), 200);
  const waiter = new Mutex(r, 'js', { lockTimeout: 5000, acquireTimeout: 5000, retryInterval: 20, refreshInterval: 0 });
  await waiter.acquire();
  await waiter.release();
  check(await gone(key), 'key on no node at the end');
}

async function counter(workers = 4, iters = 8) {
  const state = { n: 0, inside: 0, overlaps: 0 };
  const work = async () => {
    for (let i = 0; i < iters; i++) {
      const m = new Mutex(r, 'js:counter', { lockTimeout: 5000, acquireTimeout: 20000, retryInterval: 5, refreshInterval: 0 });
      await m.acquire();
      if (++state.inside > 1) state.overlaps++;
      const v = state.n;
      await sleep(1);
      state.n = v + 1;
      state.inside--;
      await m.release();
    }
  };
  await Promise.all(Array.from({ length: workers }, work));
  check(state.n === workers * iters && state.overlaps === 0,
    `counter ${state.n} with ${state.overlaps} overlaps; want ${workers * iters}`);
}

async function oneDown() {
  const m = new Mutex(r, 'js', { lockTimeout: 5000, acquireTimeout: 5000, refreshInterval: 0 });
  await m.acquire();
  check((await holding('mutex:js', m.identifier)) >= MAJORITY, 'key on a majority with one node down');
  await m.release();
  check(await gone('mutex:js'), 'key on no node after release');
}

async function majorityDown() {
  const m = new Mutex(r, 'js', { lockTimeout: 5000, acquireAttemptsLimit: 1, refreshInterval: 0 });
  let got;
  try {
    got = await m.tryAcquire();
  } catch (e) {
    check(await present('mutex:js') === 0, 'no key left behind');
    return;
  }
  check(false, 'tryAcquire with a majority down returned ' + got + '; want an error');
}

const modes = { workflow, counter, 'one-down': oneDown, 'majority-down': majorityDown };

modes[mode]().then(() => {
  console.log('ok');
  r.disconnect();
  nodes.forEach((c) => c.disconnect());
}, (e) => {
  console.log('FAILED: ' + (e && e.stack ? e.stack : e));
  process.exit(1);
});
