/**
 * `npm run demo`: two instances of the sample app on one Redis, and what the locks do between them.
 *
 * Uses REDIS_URL when set (its keys go under a unique prefix and are cleaned up), otherwise a
 * throwaway `redis-server` from PATH on a free port. Bounded in time: everything it started is
 * killed if it has not finished within DEMO_TIMEOUT_MS.
 */
import { type ChildProcess, spawn, spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { createServer } from 'node:net';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { Redis } from 'ioredis';

const DEMO_TIMEOUT_MS = 30_000;

interface Instance {
  readonly name: string;
  readonly url: string;
  readonly child: ChildProcess;
  /** The instance's own log, shown only when something goes wrong. */
  readonly log: string[];
}

interface Answer {
  readonly via: string;
  readonly status: number;
  readonly body: Record<string, unknown>;
}

const children: ChildProcess[] = [];

async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.on('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const address = server.address();
      server.close(() =>
        typeof address === 'object' && address ? resolve(address.port) : reject(new Error('no port')),
      );
    });
  });
}

async function waitFor(what: string, check: () => Promise<boolean>, timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (await check().catch(() => false)) return;
    await sleep(50);
  }
  throw new Error(`Timed out after ${timeoutMs} ms waiting for ${what}`);
}

async function ping(url: string): Promise<boolean> {
  const client = new Redis(url, {
    lazyConnect: true,
    connectTimeout: 3_000,
    retryStrategy: () => null,
    maxRetriesPerRequest: 0,
  });
  client.on('error', () => undefined);
  try {
    await client.connect();
    return (await client.ping()) === 'PONG';
  } finally {
    client.disconnect();
  }
}

/** A redis-server of our own, persisting nothing; null when there is none on PATH. */
async function startThrowawayRedis(): Promise<string | null> {
  if (spawnSync('redis-server', ['--version']).status !== 0) return null;
  const port = await freePort();
  const args = ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no'];
  children.push(spawn('redis-server', args, { stdio: 'ignore' }));
  const url = `redis://127.0.0.1:${port}`;
  await waitFor(`redis-server on port ${port}`, () => ping(url), 10_000);
  return url;
}

async function startInstance(name: string, redisUrl: string, keyPrefix: string): Promise<Instance> {
  const port = await freePort();
  const child = spawn(process.execPath, [join(__dirname, 'src', 'main.js')], {
    env: { ...process.env, REDIS_URL: redisUrl, PORT: String(port), INSTANCE_NAME: name, KEY_PREFIX: keyPrefix },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  children.push(child);
  const instance: Instance = { name, url: `http://127.0.0.1:${port}`, child, log: [] };
  for (const stream of [child.stdout, child.stderr]) {
    stream?.setEncoding('utf8').on('data', (chunk: string) => instance.log.push(chunk));
  }
  await waitFor(
    `instance ${name} on port ${port}`,
    async () => {
      if (child.exitCode !== null) throw new Error(`instance ${name} exited:\n${instance.log.join('')}`);
      await fetch(instance.url); // any answer (404 for "/") means Nest is listening
      return true;
    },
    15_000,
  );
  return instance;
}

async function call(instance: Instance, method: string, path: string, body?: unknown): Promise<Answer> {
  const response = await fetch(instance.url + path, {
    method,
    headers: body === undefined ? {} : { 'content-type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  return { via: instance.name, status: response.status, body: (await response.json()) as Record<string, unknown> };
}

/** The keys under `prefix`, by SCAN (never KEYS: REDIS_URL may point at a busy server). */
async function keysUnder(redis: Redis, prefix: string): Promise<string[]> {
  const keys: string[] = [];
  for await (const batch of redis.scanStream({ match: `${prefix}*`, count: 100 })) keys.push(...(batch as string[]));
  return keys;
}

/** A lock's holds: its hash without the holders' descriptions (the `=<owner>` fields beside each hold). */
async function holdsIn(redis: Redis, key: string): Promise<Record<string, string>> {
  const fields = await redis.hgetall(key);
  return Object.fromEntries(Object.entries(fields).filter(([field]) => !field.startsWith('=')));
}

function table(rows: string[][]): void {
  const widths = rows[0].map((_, i) => Math.max(...rows.map((row) => row[i].length)));
  for (const row of rows)
    console.log(
      '  ' +
        row
          .map((cell, i) => cell.padEnd(widths[i]))
          .join('  ')
          .trimEnd(),
    );
}

function title(text: string): void {
  console.log(`\n== ${text}`);
}

async function ordersDemo(a: Instance, b: Instance): Promise<void> {
  title('Orders: @DisLock({ key: "order:{0}", expire: 5000 }) on OrdersService.pay');
  const requests: [Instance, string][] = [
    ...[a, b, a, b, a, b].map((instance): [Instance, string] => [instance, '42']),
    [a, '43'],
    [b, '44'],
  ];
  const answers = await Promise.all(requests.map(([instance, id]) => call(instance, 'POST', `/orders/${id}/pay`)));
  table([
    ['#', 'via', 'request', 'status', 'answer'],
    ...answers.map((answer, i) => [
      String(i + 1),
      answer.via,
      `POST /orders/${requests[i][1]}/pay`,
      String(answer.status),
      answer.status === 200 ? `paid by ${String(answer.body.paidBy)}` : String(answer.body.message),
    ]),
  ]);
  const for42 = answers.slice(0, 6);
  const paid = for42.filter((answer) => answer.status === 200);
  console.log(
    `  order 42: ${paid.length} payment (by ${paid.map((answer) => String(answer.body.paidBy)).join(', ')}), ` +
      `${for42.filter((answer) => answer.status === 409).length} x 409 Conflict: one lock holder across both instances`,
  );
  console.log('  orders 43 and 44 were paid at the same time: other keys, other locks');
}

async function inventoryDemo(a: Instance, b: Instance): Promise<void> {
  title('Inventory: LockService.withLock("sku:widget", read-modify-write, { waitTime: 5000 })');
  const initial = 10;
  await call(a, 'PUT', '/inventory/widget', { stock: initial });
  const requests = Array.from({ length: 14 }, (_, i) => (i % 2 === 0 ? a : b));
  const answers = await Promise.all(requests.map((instance) => call(instance, 'POST', '/inventory/widget/reserve')));
  const reserved = answers.filter((answer) => answer.status === 200);
  const soldOut = answers.filter((answer) => answer.status === 409);
  const left = (await call(b, 'GET', '/inventory/widget')).body.stock;
  const by = (name: string): number => reserved.filter((answer) => answer.via === name).length;
  console.log(`  stock ${initial}, ${requests.length} concurrent reservations (7 via A, 7 via B)`);
  console.log(`  reserved: ${reserved.length} (A: ${by('A')}, B: ${by('B')}), out of stock (409): ${soldOut.length}`);
  console.log(
    `  units left as each reservation saw them: ${reserved
      .map((answer) => Number(answer.body.left))
      .sort((x, y) => y - x)
      .join(' ')}`,
  );
  const exact = reserved.length + Number(left) === initial;
  console.log(
    `  stock left in Redis: ${String(left)} -> ${initial} - ${reserved.length} = ${String(left)}: ${exact ? 'exact' : 'WRONG'}`,
  );
  if (!exact) throw new Error('the stock count is wrong');
}

async function transferDemo(a: Instance, b: Instance): Promise<void> {
  title(
    'Transfers: @DisLock({ key: ["sku:{0}", "sku:{1}"], waitTime: 5000 }), a multi-lock on the reservations\' locks',
  );
  await call(a, 'PUT', '/inventory/bolts', { stock: 20 });
  await call(b, 'PUT', '/inventory/nuts', { stock: 20 });
  const requests: [Instance, string, unknown][] = [];
  for (let i = 0; i < 8; i += 1) {
    requests.push([a, '/inventory/transfer', { from: 'bolts', to: 'nuts', units: 2 }]);
    requests.push([b, '/inventory/transfer', { from: 'nuts', to: 'bolts', units: 3 }]);
    if (i < 5) {
      requests.push([i % 2 === 0 ? a : b, '/inventory/bolts/reserve', undefined]);
      requests.push([i % 2 === 0 ? b : a, '/inventory/nuts/reserve', undefined]);
    }
  }
  const answers = await Promise.all(requests.map(([instance, path, body]) => call(instance, 'POST', path, body)));
  const ok = (part: string): number =>
    answers.filter((answer, i) => answer.status === 200 && requests[i][1].includes(part)).length;
  console.log(
    `  at once: 8 x bolts -> nuts (2 units) via A, 8 x nuts -> bolts (3 units) via B, 5 reservations of each SKU via both`,
  );
  console.log(
    `  done: ${ok('transfer')} transfers, ${ok('reserve')} reservations, ` +
      `refused: ${answers.filter((answer) => answer.status !== 200).length} (opposite directions, no deadlock)`,
  );
  const [bolts, nuts] = await Promise.all(
    ['bolts', 'nuts'].map(async (sku) => (await call(a, 'GET', `/inventory/${sku}`)).body.stock),
  );
  const exact = Number(bolts) + Number(nuts) === 40 - ok('reserve');
  console.log(
    `  stock now: bolts ${String(bolts)}, nuts ${String(nuts)}: ${String(bolts)} + ${String(nuts)} = 40 - ${ok('reserve')} reserved: ${exact ? 'exact' : 'WRONG'}`,
  );
  if (!exact) throw new Error('the stock count is wrong after the transfers');
  const short = await call(b, 'POST', '/inventory/transfer', { from: 'bolts', to: 'nuts', units: 1_000 });
  console.log(`  bolts -> nuts, 1000 units: ${short.status} ${String(short.body.message)}`);
  const bad = await call(a, 'POST', '/inventory/transfer', { from: 'bolts', to: 'bolts', units: 0 });
  console.log(`  bolts -> bolts, 0 units: ${bad.status} ${(bad.body.message as string[]).join('; ')}`);
}

async function pricesDemo(a: Instance, b: Instance, redis: Redis, keyPrefix: string): Promise<void> {
  title('Price list: @DisLock({ key: "prices:{0}", mode: "read" }) on reads, mode "write" on changes');
  const catalog = { bolt: 120, nut: 35, screw: 60, washer: 8 };
  await call(a, 'PUT', '/prices/catalog', { prices: catalog });
  const key = `${keyPrefix}lock:prices:catalog`;
  let watching = true;
  let mostReaders = 0;
  const watcher = (async () => {
    while (watching) {
      mostReaders = Math.max(mostReaders, Object.keys(await holdsIn(redis, key)).length);
      await sleep(5);
    }
  })();
  const started = performance.now();
  const reads = await Promise.all([a, b, a, b, a, b].map((instance) => call(instance, 'GET', '/prices/catalog')));
  const elapsed = Math.round(performance.now() - started);
  watching = false;
  await watcher;
  console.log(
    `  6 reads at once via A and B: ${reads.filter((r) => r.status === 200).length} x 200 in ${elapsed} ms ` +
      `(one read takes ~200 ms); readers in the lock's hash at once (HLEN): up to ${mostReaders}`,
  );

  // A repricing (+10 %, one key at a time) via B, with reads going on via both instances.
  const states = new Map<number, Record<string, number>>([[1, catalog]]);
  let repricing = true;
  const seen: Answer[] = [];
  const reader = async (instance: Instance): Promise<void> => {
    while (repricing) seen.push(await call(instance, 'GET', '/prices/catalog'));
  };
  const readers = Promise.all([reader(a), reader(b), reader(a), reader(b)]);
  await sleep(100);
  const reprice = await call(b, 'POST', '/prices/catalog/reprice', { percent: 10 });
  repricing = false;
  await readers;
  states.set(Number(reprice.body.revision), reprice.body.prices as Record<string, number>);
  const torn = seen.filter(
    (r) => JSON.stringify(r.body.prices) !== JSON.stringify(states.get(Number(r.body.revision))),
  );
  const count = (revision: number): number => seen.filter((r) => r.body.revision === revision).length;
  console.log(
    `  repricing +10 % via B: revision ${String(reprice.body.revision)}, ${JSON.stringify(reprice.body.prices)}`,
  );
  console.log(
    `  reads meanwhile: ${seen.length} (revision 1: ${count(1)}, revision 2: ${count(2)}), ` +
      `half-done: ${torn.length}: each read saw one revision whole`,
  );
  if (torn.length > 0) throw new Error('a read saw a repricing half-done');
}

async function exportsDemo(a: Instance, b: Instance, redis: Redis, keyPrefix: string): Promise<void> {
  title('Report exports: @DisLock({ key: "exports", permits: 2 }), a semaphore');
  const key = `${keyPrefix}lock:exports`;
  const requests: [Instance, string][] = [
    [a, 'q1'],
    [b, 'q2'],
    [a, 'q3'],
  ];
  const pending = requests.map(([instance, name]) => call(instance, 'POST', `/reports/${name}/export`));
  await waitFor('two permits', async () => Object.keys(await holdsIn(redis, key)).length === 2, 5_000);
  const held = Object.values(await holdsIn(redis, key)).map((end) => `${Number(end) - Date.now()} ms`);
  const answers = await Promise.all(pending);
  table([
    ['#', 'via', 'request', 'status', 'answer'],
    ...answers.map((answer, i) => [
      String(i + 1),
      answer.via,
      `POST /reports/${requests[i][1]}/export`,
      String(answer.status),
      answer.status === 200
        ? `${String(answer.body.file)} by ${String(answer.body.exportedBy)} in ${String(answer.body.durationMs)} ms`
        : String(answer.body.message),
    ]),
  ]);
  console.log(
    `  Redis held 2 permits, one field each, leases ending in ${held.join(' and ')}; the exports ran twice ` +
      'as long as that lease: the watchdog renewed each permit',
  );
  const refused = answers.findIndex((answer) => answer.status === 409);
  if (refused >= 0) {
    const [instance, name] = requests[refused];
    const retried = await call(instance, 'POST', `/reports/${name}/export`);
    console.log(`  #${refused + 1} retried once the permits were back: ${retried.status}`);
  }
}

/** The digest job (`@Cron` every second on both instances): who ran each of the last seconds. */
async function digestDemo(redis: Redis, keyPrefix: string): Promise<void> {
  title('Digest job: @Cron every second on both instances, @DisLock onBusy skip + lockAtLeastFor');
  const runs = await redis.lrange(`${keyPrefix}digests`, -6, -1);
  const bySecond = new Map<number, string[]>();
  for (const entry of runs) {
    const [at, instance] = entry.split(':');
    const second = Math.floor(Number(at) / 1000);
    bySecond.set(second, [...(bySecond.get(second) ?? []), instance]);
  }
  for (const [second, instances] of bySecond) {
    console.log(`  second ${second % 100}: run by ${instances.join(' and ')}`);
  }
  console.log('  (the other instance found the lock taken and skipped: once per second in all)');
}

async function reportDemo(a: Instance, b: Instance, redis: Redis, keyPrefix: string): Promise<void> {
  title('Reports: @DisLock({ key: "report:{0}" }), renewed by the watchdog');
  const job = call(a, 'POST', '/reports/monthly');
  const key = `${keyPrefix}lock:report:monthly`;
  await waitFor('the report lock', async () => (await redis.exists(key)) === 1, 5_000);
  const second = await call(b, 'POST', '/reports/monthly');
  console.log(`  the same report started via B while A runs it: ${second.status} ${String(second.body.message)}`);
  const { status, body: report } = await job;
  if (status !== 200) throw new Error(`the report failed: ${status} ${JSON.stringify(report)}`);
  const pttl = report.pttlMs as number[];
  const lease = Number(report.lockWatchdogTimeout);
  const duration = Number(report.durationMs);
  const ups = pttl.filter((value, i) => i > 0 && value > pttl[i - 1]).length;
  console.log(
    `  via A: ${String(report.steps)}/${String(report.stepsPlanned)} steps in ${duration} ms with ` +
      `lockWatchdogTimeout ${lease} ms (${(duration / lease).toFixed(1)}x the lease), completed: ${String(report.completed)}`,
  );
  console.log(`  PTTL of the lock after each step (ms): ${pttl.join(' ')}`);
  console.log(
    `  -> unrenewed, the key would have expired ${lease} ms after the start; the watchdog reset it every ` +
      `${Math.floor(lease / 3)} ms (the PTTL went back up ${ups} times), so after ${duration} ms it still had ` +
      `${pttl[pttl.length - 1]} ms left (lowest seen: ${Math.min(...pttl)} ms)`,
  );
  console.log(`  after the job: EXISTS ${key} = ${await redis.exists(key)} (released)`);
}

/** SIGTERM, as a process manager would; SIGKILL after 5 s. */
async function stop(child: ChildProcess): Promise<string> {
  if (child.exitCode !== null || child.signalCode !== null) return 'already gone';
  const exited = new Promise<string>((resolve) =>
    child.once('exit', (code, signal) => resolve(signal ? `exited on ${signal}` : `exited with code ${code}`)),
  );
  child.kill('SIGTERM');
  const timer = setTimeout(() => child.kill('SIGKILL'), 5_000);
  try {
    return await exited;
  } finally {
    clearTimeout(timer);
  }
}

function killEverything(): void {
  for (const child of children) if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
}

async function main(): Promise<void> {
  const redisUrl = process.env.REDIS_URL ?? (await startThrowawayRedis());
  if (!redisUrl) {
    console.error(
      [
        'The demo needs Redis: either set REDIS_URL, or put `redis-server` on PATH and it starts its own:',
        '  sudo apt-get install -y redis-server   (Debian/Ubuntu)',
        '  brew install redis                      (macOS)',
      ].join('\n'),
    );
    process.exit(1);
  }
  if (!(await ping(redisUrl).catch(() => false))) {
    console.error(`Cannot reach Redis at ${redisUrl}`);
    process.exit(1);
  }
  const keyPrefix = `dislock-demo:${randomBytes(3).toString('hex')}:`;
  console.log(
    `Redis: ${redisUrl}${process.env.REDIS_URL ? ' (REDIS_URL)' : ' (throwaway redis-server)'}, keys under ${keyPrefix}`,
  );
  const redis = new Redis(redisUrl, { maxRetriesPerRequest: 1 });
  redis.on('error', () => undefined); // a failing command reports it
  const instances: Instance[] = [];
  try {
    instances.push(
      ...(await Promise.all([startInstance('A', redisUrl, keyPrefix), startInstance('B', redisUrl, keyPrefix)])),
    );
    const [a, b] = instances;
    console.log(`Instances: A on ${a.url}, B on ${b.url}`);
    await ordersDemo(a, b);
    await inventoryDemo(a, b);
    await transferDemo(a, b);
    await pricesDemo(a, b, redis, keyPrefix);
    await exportsDemo(a, b, redis, keyPrefix);
    await reportDemo(a, b, redis, keyPrefix);
    await digestDemo(redis, keyPrefix);

    title('Shutdown');
    for (const instance of instances) {
      console.log(`  ${instance.name}: SIGTERM -> ${await stop(instance.child)} (locks released, connections closed)`);
    }
    // The digest lock of the last tick may still be within its lockAtLeastFor (500 ms): it is left
    // to expire then, not deleted at shutdown. Past that, anything left would be a leaked lock.
    await sleep(600);
    // Fencing counters (`<keyPrefix>#fence:{tag}`, one per hash slot ever used) stay on purpose:
    // they keep fencing tokens increasing across restarts. Everything else would be a leaked lock.
    const leftover = await keysUnder(redis, `${keyPrefix}lock:`);
    const counters = leftover.filter((key) => key.includes('#fence:'));
    // Say which they are and why each is still there: a lease (or lockAtLeastFor) not over yet
    // expires on its own; a key without expiry would be a leak.
    const left = await Promise.all(
      leftover
        .filter((key) => !key.includes('#fence:'))
        .map(async (key) => {
          const ms = await redis.pttl(key);
          const why = ms >= 0 ? `expires in ${ms} ms: its lease or lockAtLeastFor is not over` : 'NO EXPIRY: a leak';
          return `${key.slice(keyPrefix.length)} (${why})`;
        }),
    );
    console.log(`  locks left in Redis: ${left.length}${left.length > 0 ? ` - ${left.join(', ')}` : ''}`);
    console.log(
      `  fencing counters kept: ${counters.length} (one per hash slot used, by design: they keep fencing tokens increasing across restarts)`,
    );
  } catch (error) {
    for (const instance of instances) console.error(`--- log of instance ${instance.name}:\n${instance.log.join('')}`);
    throw error;
  } finally {
    const keys = await keysUnder(redis, keyPrefix);
    if (keys.length > 0) await redis.del(...keys);
    await redis.quit();
  }
}

const overall = setTimeout(() => {
  console.error(`Demo timed out after ${DEMO_TIMEOUT_MS} ms; stopping everything it started`);
  killEverything();
  process.exit(1);
}, DEMO_TIMEOUT_MS);
for (const signal of ['SIGINT', 'SIGTERM'] as const) {
  process.once(signal, () => {
    killEverything();
    process.exit(1);
  });
}

main()
  .then(async () => {
    await Promise.all(children.map(stop)); // the throwaway redis-server, if any
    clearTimeout(overall);
    console.log('\nDone.');
  })
  .catch((error: unknown) => {
    console.error(error);
    killEverything();
    process.exit(1);
  });
