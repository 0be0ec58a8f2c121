/**
 * What the fencing counter costs Redis: the library's acquire script (read from
 * lib/store/redis/scripts/acquire.script.ts, so it is always the current one) against variants of
 * it, each followed by the library's release script, on a redis-server of its own.
 *
 *   node -r ./test/support/ts-register.js bench/fence-cost.ts [--loops 64] [--seconds 3] [--rounds 3]
 *
 * Per variant and round: `--loops` concurrent acquire + release loops on distinct keys, no
 * pipelining (as the uncontended benchmark cell), for `--seconds`. Reported per cycle: Redis CPU
 * (`used_cpu_user + used_cpu_sys` delta: parsing, networking and the scripts), the time Redis
 * spent running the two scripts (`INFO commandstats` usec of EVALSHA, inner commands included) and
 * the Redis calls made. Rounds run the variants in turn, so that load on the machine hits them all.
 */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import type { Redis } from 'ioredis';
import { hr } from './support/clock';
import { infoDelta, infoSnapshot, OwnRedis, plainClient, ready } from './support/redis';
import { median } from './support/stats';

const ROOT = join(__dirname, __dirname.endsWith('dist') ? '../..' : '..');

function scriptSource(file: string): string {
  const text = readFileSync(join(ROOT, 'lib/store/redis/scripts', file), 'utf8');
  const source = /`([\s\S]*)`/.exec(text)?.[1];
  if (!source) throw new Error(`no script source in ${file}`);
  return source;
}

/** The variants: what each changes in the acquire script. */
const VARIANTS: Record<string, (current: string) => string> = {
  /** As shipped: TIME, GET and SET on the slot's counter (3 inner calls). */
  current: (current) => current,
  /** No fencing token at all (returns 0): the floor, not an option. */
  'no-fence': () => `
local key, owner = KEYS[1], ARGV[1]
local free = redis.call('exists', key) == 0
if not free and redis.pcall('hexists', key, owner) ~= 1 then
  return {0, redis.call('pttl', key)}
end
if free then
  redis.call('hset', key, owner, 1)
  redis.call('pexpire', key, ARGV[2])
end
return {1, 0}
`,
  /**
   * The same tokens in 2 inner calls when the clock is ahead of the counter (always, unless more
   * than one acquisition per microsecond hits the slot): TIME, then SET ... GET (Redis >= 6.2)
   * writes the clock and returns the previous value; only when that was not smaller (the clock
   * is behind the counter) a second SET writes last + 1.
   */
  'set-get': () => `
local key, owner = KEYS[1], ARGV[1]
local free = redis.call('exists', key) == 0
if not free and redis.pcall('hexists', key, owner) ~= 1 then
  return {0, redis.call('pttl', key)}
end
local now = redis.call('time')
local token = tonumber(now[1]) * 1000000 + tonumber(now[2])
local last = tonumber(redis.call('set', KEYS[2], string.format('%.0f', token), 'GET'))
if last and last >= token then
  token = last + 1
  redis.call('set', KEYS[2], string.format('%.0f', token))
end
if free then
  redis.call('hset', key, owner, 1)
  redis.call('pexpire', key, ARGV[2])
end
return {1, token}
`,
  /** A bare INCR (1 inner call): not clock-seeded, so NOT strictly increasing across a lost counter; for scale only. */
  incr: () => `
local key, owner = KEYS[1], ARGV[1]
local free = redis.call('exists', key) == 0
if not free and redis.pcall('hexists', key, owner) ~= 1 then
  return {0, redis.call('pttl', key)}
end
local token = redis.call('incr', KEYS[2])
if free then
  redis.call('hset', key, owner, 1)
  redis.call('pexpire', key, ARGV[2])
end
return {1, token}
`,
};

interface Sample {
  readonly redisCpuUs: number;
  readonly scriptUs: number;
  readonly calls: number;
  readonly cyclesPerSec: number;
}

async function measure(
  client: Redis,
  admin: Redis,
  acquireSha: string,
  releaseSha: string,
  loops: number,
  ms: number,
): Promise<Sample> {
  let cycles = 0;
  let owners = 0;
  const before = await infoSnapshot(admin);
  const started = hr();
  const end = started + ms;
  await Promise.all(
    Array.from({ length: loops }, async (_, worker) => {
      const key = `fence-cost:u:${worker}`;
      // Where the library puts the counter: one key per slot; a hash tag keeps it in the lock's slot.
      const fence = `fence-cost:#fence:{${key}}`;
      while (hr() < end) {
        const owner = `owner-${process.pid}-${(owners += 1)}`;
        const reply = (await client.evalsha(acquireSha, 2, key, fence, owner, 10_000)) as [number, number];
        if (reply[0] !== 1) throw new Error(`${key} busy`);
        await client.evalsha(releaseSha, 1, key, owner, 'bench:1', 0, 0);
        cycles += 1;
      }
    }),
  );
  const elapsed = hr() - started;
  const after = await infoSnapshot(admin);
  const delta = infoDelta(before, after);
  const scriptUs = (after.usec.evalsha ?? 0) - (before.usec.evalsha ?? 0);
  return {
    redisCpuUs: (delta.redisCpuMs * 1000) / cycles,
    scriptUs: scriptUs / cycles,
    calls: delta.totalCalls / cycles,
    cyclesPerSec: cycles / (elapsed / 1000),
  };
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      loops: { type: 'string', default: '64' },
      seconds: { type: 'string', default: '3' },
      rounds: { type: 'string', default: '3' },
    },
  });
  const redis = await OwnRedis.start();
  const client = plainClient(redis.url, 'fence-cost');
  const admin = plainClient(redis.url, 'fence-cost-admin');
  try {
    await Promise.all([ready(client), ready(admin)]);
    const current = scriptSource('acquire.script.ts');
    const releaseSha = (await client.script('LOAD', scriptSource('release.script.ts'))) as string;
    const shas: Record<string, string> = {};
    for (const [name, variant] of Object.entries(VARIANTS)) {
      shas[name] = (await client.script('LOAD', variant(current))) as string;
    }
    const samples: Record<string, Sample[]> = {};
    for (let round = 0; round < Number(values.rounds); round += 1) {
      for (const name of Object.keys(VARIANTS)) {
        await admin.flushall();
        const sample = await measure(
          client,
          admin,
          shas[name],
          releaseSha,
          Number(values.loops),
          Number(values.seconds) * 1000,
        );
        (samples[name] ??= []).push(sample);
      }
    }
    console.log(
      `redis-server ${(await admin.info('server')).match(/redis_version:(\S+)/)?.[1]}, node ${process.version}, ` +
        `${values.loops} loops, ${values.rounds} rounds of ${values.seconds} s; medians per acquire + release cycle`,
    );
    console.log('| acquire script | Redis calls | scripts µs (commandstats) | Redis CPU µs | cycles/s |');
    console.log('| --- | ---: | ---: | ---: | ---: |');
    for (const [name, list] of Object.entries(samples)) {
      const m = (pick: (sample: Sample) => number): number => median(list.map(pick));
      console.log(
        `| ${name} | ${m((s) => s.calls).toFixed(1)} | ${m((s) => s.scriptUs).toFixed(2)} | ` +
          `${m((s) => s.redisCpuUs).toFixed(2)} | ${Math.round(m((s) => s.cyclesPerSec)).toLocaleString('en-US')} |`,
      );
    }
  } finally {
    client.disconnect();
    admin.disconnect();
    await redis.stop();
  }
}

main().catch((error: unknown) => {
  console.error(error);
  process.exit(1);
});
