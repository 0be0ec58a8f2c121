/**
 * The uncontended acquire + release cycle in one process, for `--cpu-prof`: `--loops` concurrent
 * loops (default 64), each on its own key, for `--seconds` (default 5) after a 1 s warm-up, against
 * a redis-server of its own. Prints cycles/s and CPU µs per cycle of the measuring window.
 *
 *   node -r ./test/support/ts-register.js --cpu-prof --cpu-prof-dir=/tmp/prof \
 *     bench/profile-uncontended.ts --mode service
 *   (or, built: npm run build && tsc -p bench/tsconfig.build.json && node bench/dist/profile-uncontended.js)
 *
 * `--profile <file>` profiles the measuring window only (the V8 CPU profiler that `--cpu-prof` uses,
 * started and stopped through `node:inspector`), and writes the `.cpuprofile` there; summarize it
 * with `bench/profile-summary.ts --cycles <the cycles printed>` for µs per cycle.
 *
 * `--fake-redis` answers the lock scripts' EVALSHA in the process (in batches, on `setImmediate`,
 * as replies come in from a socket) instead of sending them: what is left is the CPU of the
 * library and of ioredis building its commands and promises, without the socket writes and reads
 * that are most of a real cycle and whose cost moves with the load on the machine.
 *
 * `--heap-profile <file>` samples what the measuring window allocates instead (V8's sampling heap
 * profiler, collected objects included), for `bench/profile-summary.ts --heap`.
 *
 * `--count-promises` counts the promises made per cycle instead (an async hook: slow, but exact).
 *
 * `--async-hooks` runs an `AsyncLocalStorage` of its own once before measuring, as anything else in
 * an application may (nestjs-cls, OpenTelemetry): on Node 20 that turns Node's promise hooks on
 * for every promise of the process, which `@DisLock`'s reentrancy scope does too; on Node 24 it
 * changes nothing. `--mode lock --async-hooks` is what the hooks alone cost `LockService`.
 *
 * Modes: `service` (`LockService.tryLock` + `release()`), `lock` (`LockService.lock` + `release()`,
 * as the benchmark cell does), `decorator` (an `async` `@DisLock` method), `raw` (two EVALSHA
 * round trips, the benchmark's ceiling). `--permits 4` takes a semaphore's permit instead of a plain
 * lock, `--read` a reader's hold (modes `service` and `lock`).
 */
import { AsyncLocalStorage, createHook } from 'node:async_hooks';
import { writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { Session } from 'node:inspector/promises';
import { parseArgs } from 'node:util';
import { startDislockApp } from './contenders/nest-app';
import { cpuMicros, hr, sleepUntil } from './support/clock';
import type { Redis } from 'ioredis';
import { OwnRedis, plainClient, ready } from './support/redis';

const SET_NX_PX = "return redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])";
const COMPARE_AND_DELETE =
  "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0";
const LEASE_MS = 10_000;
const noop = (): Promise<void> => Promise.resolve();

type Cycle = (key: string) => Promise<void>;

type Command = Parameters<Redis['sendCommand']>[0];

/**
 * Answer EVALSHA here: `answer(args)` gives the reply, resolved with the other replies of the same
 * turn of the event loop on the next `setImmediate`. Every other command goes to Redis.
 */
function fakeEvalsha(client: Redis, answer: (args: readonly unknown[]) => unknown): void {
  const send = client.sendCommand.bind(client);
  let batch: [Command, unknown][] = [];
  const flush = (): void => {
    const due = batch;
    batch = [];
    for (const [command, reply] of due) command.resolve(reply);
  };
  client.sendCommand = (command: Command, stream?: Parameters<Redis['sendCommand']>[1]) => {
    if (command.name !== 'evalsha') return send(command, stream);
    if (batch.length === 0) setImmediate(flush);
    batch.push([command, answer(command.args)]);
    return command.promise;
  };
}

/**
 * What Redis answers the lock scripts of an uncontended cycle, told apart by their SHA (not by how
 * many keys they name, which changes with the scripts): every acquisition is granted with the next
 * fencing token, every release frees a lock nobody waits for, every renewal or check of a batch finds
 * its lock held, a reentrant check finds it held with the whole lease left.
 */
function lockScriptAnswers(): (args: readonly unknown[]) => unknown {
  let token = 1_700_000_000_000_000;
  const answers = new Map<unknown, (args: readonly unknown[]) => unknown>([
    [scriptSha('acquire', 'ACQUIRE_SCRIPT'), () => [1, (token += 1)]],
    [scriptSha('acquire-shared', 'ACQUIRE_SHARED_SCRIPT'), () => [1, (token += 1)]],
    [scriptSha('release', 'RELEASE_SCRIPT'), () => [1, '', '', '']],
    [scriptSha('renew', 'RENEW_SCRIPT'), (args) => Array.from({ length: Number(args[1]) }, () => 1)],
    [scriptSha('check', 'CHECK_SCRIPT'), () => [1, LEASE_MS]],
  ]);
  return (args) => {
    const answer = answers.get(args[0]);
    if (!answer) throw new Error(`--fake-redis: no answer for the script ${String(args[0])}`);
    return answer(args);
  };
}

/**
 * The SHA of one of the library's lock scripts, from the package's own file (`lib/` through
 * ts-register, or the built `dist/`): the scripts are not part of its public API.
 */
function scriptSha(script: string, exported: string): string {
  const scripts = join(dirname(require.resolve('nestjs-dislock')), 'store', 'redis', 'scripts');
  // eslint-disable-next-line @typescript-eslint/no-require-imports -- a file of the package, not an entry point of it
  const module = require(join(scripts, `${script}.script`)) as Record<string, { readonly sha: string } | undefined>;
  const sha = module[exported]?.sha;
  if (sha === undefined) throw new Error(`--fake-redis: no ${exported} in ${scripts}`);
  return sha;
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      mode: { type: 'string', default: 'service' },
      loops: { type: 'string', default: '64' },
      seconds: { type: 'string', default: '5' },
      redis: { type: 'string' },
      'fake-redis': { type: 'boolean', default: false },
      profile: { type: 'string' },
      'heap-profile': { type: 'string' },
      'count-promises': { type: 'boolean', default: false },
      'async-hooks': { type: 'boolean', default: false },
      // OpenTelemetry: 'default' (the module's default: on, through @opentelemetry/api, which is
      // installed here, with no SDK registered), 'off' (telemetry: false), 'sdk' (a MeterProvider
      // and a TracerProvider registered, exporting nowhere).
      telemetry: { type: 'string', default: 'default' },
      // A listener on every lock event type, doing nothing.
      listeners: { type: 'boolean', default: false },
      // A semaphore of this many permits instead of a plain lock (modes service and lock).
      permits: { type: 'string' },
      // A reader of a read-write lock instead of a plain lock (modes service and lock).
      read: { type: 'boolean', default: false },
    },
  });
  if (values.telemetry === 'sdk') await registerSdk();
  if (values['async-hooks']) {
    new AsyncLocalStorage<boolean>().run(true, () => undefined); // on Node 20 the hooks then stay on
  }
  const loops = Number(values.loops);
  const measureMs = Number(values.seconds) * 1000;
  const own = values.redis ? undefined : await OwnRedis.start();
  const url = values.redis ?? (own as OwnRedis).url;
  const client = plainClient(url, `profile-${process.pid}`);
  await ready(client);
  let cycle: Cycle;
  let close = async (): Promise<void> => undefined;

  if (values.mode === 'raw') {
    const setSha = (await client.script('LOAD', SET_NX_PX)) as string;
    const delSha = (await client.script('LOAD', COMPARE_AND_DELETE)) as string;
    let counter = 0;
    if (values['fake-redis']) fakeEvalsha(client, (args) => (args[0] === setSha ? 'OK' : 1));
    cycle = async (key) => {
      const token = `${process.pid}:${++counter}`;
      if ((await client.evalsha(setSha, 1, key, token, LEASE_MS)) !== 'OK') throw new Error(`busy: ${key}`);
      await noop();
      await client.evalsha(delSha, 1, key, token);
    };
  } else {
    const { app, locks, target } = await startDislockApp({
      redis: client,
      ...(values.telemetry === 'off' && { telemetry: false }),
    });
    if (values.listeners) {
      for (const type of ['acquired', 'waiting', 'busy', 'renewed', 'renewal-failed', 'lost', 'released'] as const) {
        locks.on(type, () => undefined);
      }
    }
    close = () => app.close();
    if (values['fake-redis']) fakeEvalsha(client, lockScriptAnswers());
    const options = {
      expire: LEASE_MS,
      ...(values.permits !== undefined && { permits: Number(values.permits) }),
      ...(values.read && { mode: 'read' as const }),
    };
    if (values.mode === 'service') {
      cycle = async (key) => {
        const handle = await locks.tryLock(`k:${key}`, options);
        if (!handle) throw new Error(`busy: ${key}`);
        await noop();
        await handle.release();
      };
    } else if (values.mode === 'lock') {
      cycle = async (key) => {
        const handle = await locks.lock(`k:${key}`, options);
        await noop();
        await handle.release();
      };
    } else if (values.mode === 'decorator') {
      cycle = (key) => target.once(key, noop);
    } else {
      throw new Error(`--mode: service, lock, decorator or raw, got ${values.mode}`);
    }
  }

  const start = hr() + 1_000;
  const end = start + measureMs;
  let cycles = 0;
  let cpuAtStart = 0;
  let usageAtStart = process.cpuUsage();
  const session = values.profile || values['heap-profile'] ? new Session() : undefined;
  if (session) session.connect();
  if (session && values.profile) {
    await session.post('Profiler.enable');
    await session.post('Profiler.setSamplingInterval', { interval: 100 });
  }
  let promises = 0;
  const counting = values['count-promises']
    ? createHook({ init: (_id, type) => void (type === 'PROMISE' && (promises += 1)) })
    : undefined;
  const window = (async () => {
    await sleepUntil(start);
    if (session && values.profile) await session.post('Profiler.start');
    if (session && values['heap-profile']) {
      await session.post('HeapProfiler.startSampling', {
        samplingInterval: 256,
        includeObjectsCollectedByMajorGC: true,
        includeObjectsCollectedByMinorGC: true,
      });
    }
    cpuAtStart = cpuMicros();
    usageAtStart = process.cpuUsage();
    counting?.enable();
  })();
  const loop = async (worker: number): Promise<void> => {
    const key = `u:${worker}`;
    for (let now = hr(); now < end; now = hr()) {
      await cycle(key);
      if (now >= start) cycles += 1;
    }
  };
  await Promise.all(Array.from({ length: loops }, (_, worker) => loop(worker)));
  const cpuUs = cpuMicros() - cpuAtStart;
  const usage = process.cpuUsage(usageAtStart);
  counting?.disable();
  await window;
  if (session && values.profile) {
    const { profile } = await session.post('Profiler.stop');
    writeFileSync(values.profile, JSON.stringify(profile));
  }
  if (session && values['heap-profile']) {
    const { profile } = await session.post('HeapProfiler.stopSampling');
    writeFileSync(values['heap-profile'], JSON.stringify(profile));
  }
  session?.disconnect();
  console.log(
    `${values.mode} node ${process.version} loops ${loops}: ${Math.round(cycles / (measureMs / 1000))} cycles/s, ` +
      `${(cpuUs / Math.max(1, cycles)).toFixed(1)} µs CPU per cycle (${cycles} cycles; ` +
      `user ${(usage.user / Math.max(1, cycles)).toFixed(1)}, system ${(usage.system / Math.max(1, cycles)).toFixed(1)})` +
      (counting ? `, ${(promises / Math.max(1, cycles)).toFixed(2)} promises per cycle` : ''),
  );
  await close();
  await client.quit();
  await own?.stop();
}

main().catch((error: unknown) => {
  console.error(error);
  process.exit(1);
});

/** An OpenTelemetry SDK that records everything and exports nowhere: what the instruments cost with one. */
async function registerSdk(): Promise<void> {
  const { metrics, trace } = await import('@opentelemetry/api');
  const { MeterProvider, MetricReader } = await import('@opentelemetry/sdk-metrics');
  const { TracerProvider } = await import('@opentelemetry/sdk-trace');
  class NoExport extends MetricReader {
    protected async onShutdown(): Promise<void> {}
    protected async onForceFlush(): Promise<void> {}
  }
  metrics.setGlobalMeterProvider(new MeterProvider({ readers: [new NoExport()] }));
  trace.setGlobalTracerProvider(new TracerProvider());
}
