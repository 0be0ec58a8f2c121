/**
 * Least privilege: the ACL rule the library needs (dislockAclRule), shown to be enough for the whole
 * lock lifecycle and for nothing to be refused (ACL LOG stays empty), and every part of it shown
 * to be needed (the startup access check names what is missing). The access check's behaviour when
 * Redis refuses, has scripting disabled, is down or frozen. Passwords never reach logs or errors.
 * Private redis-servers only: ACL users are made on them with ACL SETUSER.
 */
import { inspect } from 'node:util';
import { Logger } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import { Cluster, Redis, type RedisOptions } from 'ioredis';
import {
  DisLockModule,
  type DisLockModuleOptions,
  InvalidLockOptionsError,
  LockService,
  RedisAccessError,
  RedisUnavailableError,
} from 'nestjs-dislock';
import { checkRedisAccess } from '../lib/store/redis/access.check';
import { dislockAclRule } from '../lib/store/redis/acl.rule';
import { ACQUIRE_SCRIPT } from '../lib/store/redis/scripts/acquire.script';
import { CHECK_SCRIPT } from '../lib/store/redis/scripts/check.script';
import { settle } from './support/async';
import { RedisCluster } from './support/cluster';
import { RedisServer } from './support/redis-server';
import { eventually, sleep } from './support/shared-redis';
import { holdsOf } from './support/lock-hash';

const PASSWORD = 'Acl-Test-Secret-7f3a9c';
const RULE = dislockAclRule('dislock:');

/** Everything a logger or the console was asked to print, as text. */
class Captured {
  readonly lines: string[] = [];
  private readonly spies: { mockRestore(): void }[] = [];

  constructor() {
    const record =
      (level: string) =>
      (...args: unknown[]): void =>
        void this.lines.push(
          `${level}: ${args.map((a) => (typeof a === 'string' ? a : inspect(a, { depth: 10 }))).join(' ')}`,
        );
    for (const level of ['log', 'warn', 'error', 'debug', 'verbose', 'fatal'] as const) {
      this.spies.push(vi.spyOn(Logger.prototype, level).mockImplementation(record(`Logger.${level}`)));
      this.spies.push(vi.spyOn(Logger, level).mockImplementation(record(`Logger.static.${level}`)));
    }
    for (const level of ['log', 'warn', 'error', 'info', 'debug'] as const) {
      this.spies.push(vi.spyOn(console, level).mockImplementation(record(`console.${level}`)));
    }
  }

  get text(): string {
    return this.lines.join('\n');
  }

  restore(): void {
    for (const spy of this.spies.splice(0)) spy.mockRestore();
  }
}

/** Everything a caller can see of an error: message, stack, own properties, and the same for each cause. */
function everythingAbout(error: unknown): string {
  const parts: string[] = [];
  let current: unknown = error;
  for (let depth = 0; current !== undefined && depth < 10; depth += 1) {
    parts.push(inspect(current, { depth: 20, showHidden: true, getters: true }));
    if (current instanceof Error) {
      parts.push(current.message, String(current.stack));
      current = current.cause;
    } else {
      current = undefined;
    }
  }
  return parts.join('\n');
}

describe('least privilege (ACL)', () => {
  let server: RedisServer;
  let admin: Redis;
  const clients: Redis[] = [];

  const user = async (name: string, rule: string): Promise<void> => {
    await admin.call('ACL', 'SETUSER', name, 'reset', 'on', `>${PASSWORD}`, ...rule.split(' '));
  };
  const connect = (name: string, options: RedisOptions = {}): Redis => {
    const client = new Redis({
      host: '127.0.0.1',
      port: server.port,
      username: name,
      password: PASSWORD,
      maxRetriesPerRequest: 1,
      ...options,
    });
    client.on('error', () => undefined);
    clients.push(client);
    return client;
  };
  const aclLog = async (): Promise<string[]> => {
    const entries = (await admin.call('ACL', 'LOG')) as unknown[][];
    return entries.map((entry) => {
      const fields = new Map<string, unknown>();
      for (let i = 0; i < entry.length; i += 2) fields.set(String(entry[i]), entry[i + 1]);
      return `${String(fields.get('username'))} ${String(fields.get('reason'))} ${String(fields.get('object'))} (${String(fields.get('context'))})`;
    });
  };
  const keys = (): Promise<string[]> => admin.keys('*');

  beforeAll(async () => {
    server = await RedisServer.start();
    admin = server.client();
  });

  afterEach(async () => {
    for (const client of clients.splice(0)) client.disconnect();
    await admin.flushall();
    await admin.call('ACL', 'LOG', 'RESET');
  });

  afterAll(async () => {
    admin?.disconnect();
    await server?.dispose();
  });

  it('the rule for the default prefix, single server and Cluster', () => {
    expect(RULE).toBe(
      'resetkeys ~dislock:* resetchannels &dislock:* -@all +evalsha +eval +exists +hexists +hget +hgetall +hset ' +
        '+hdel +type +pttl ' +
        '+pexpire +get +set +del +time +zadd +zrem +zscore +zrange +zrangebyscore +zremrangebyscore ' +
        '+publish +subscribe +unsubscribe +info',
    );
    expect(dislockAclRule('dislock:', { cluster: true, replicas: true })).toBe(
      `${RULE} +spublish +ssubscribe +sunsubscribe +cluster|slots +cluster|info +asking +readonly +client|setname +wait`,
    );
    // Glob characters in a prefix are matched literally.
    expect(dislockAclRule('a*b?[c]\\:')).toMatch(/^resetkeys ~a\\\*b\\\?\\\[c\\\]\\\\:\* resetchannels &a\\\*b/);
  });

  it('Redis takes the rule, and a prefix with glob characters matches only itself', async () => {
    await user('globby', dislockAclRule('a*b:'));
    const client = connect('globby');
    await expect(checkRedisAccess(client, 'a*b:', 2_000)).resolves.toBeUndefined();
    const refused = await settle(checkRedisAccess(client, 'axb:', 2_000));
    expect(refused.ok).toBe(false);
    expect((refused as { error: unknown }).error).toBeInstanceOf(RedisAccessError);
    expect(await keys()).toEqual([]);
  });

  it('the whole lifecycle as a user with only the rule: acquire, re-entry, renew, wait woken by pub/sub, fencing, release, shutdown; nothing refused', async () => {
    await user('dislock', RULE);
    const capture = new Captured();
    const apps: { close(): Promise<void> }[] = [];
    try {
      const start = async (): Promise<LockService> => {
        const options: DisLockModuleOptions = {
          redis: `redis://dislock:${PASSWORD}@127.0.0.1:${server.port}`,
          lockWatchdogTimeout: 600, // renewed every 200 ms
          operationTimeout: 2_000,
        };
        const moduleRef = await Test.createTestingModule({ imports: [DisLockModule.forRoot(options)] }).compile();
        const app = await moduleRef.init();
        apps.push(app);
        return app.get(LockService);
      };
      const [a, b] = [await start(), await start()];

      // acquire, then a re-entry (the check script) inside it, then renewals.
      let tokens: number[] = [];
      await a.withLock('order:1', async (outer) => {
        tokens.push(outer.fencingToken);
        await a.withLock('order:1', async (inner) => {
          expect(inner.owner).toBe(outer.owner);
          expect(inner.fencingToken).toBe(outer.fencingToken);
        });
        await sleep(900); // longer than the lease: held only because the watchdog renewed it
        expect(outer.signal.aborted).toBe(false);
        expect(await holdsOf(admin, 'dislock:order:1')).toEqual({ [outer.owner]: '1' });
      });

      // b waits for a's lock; a's release wakes it through pub/sub. No timer would this soon: not
      // the 30 s lease, nor b's refresh of its place in the line (lineRefreshMs, 1 s after its last
      // attempt, which came just before the release: so within the 1 s this allowed before).
      const held = await a.lock('order:2', { lockWatchdogTimeout: 30_000 });
      const waiting = settle(b.lock('order:2', { waitTime: 10_000, lockWatchdogTimeout: 30_000 }));
      expect(await eventually(async () => (await admin.pubsub('NUMSUB', 'dislock:order:2'))[1] === 1)).toBe(true);
      const releasedAt = performance.now();
      expect(await held.release()).toBe(true);
      const woken = await waiting;
      expect(woken.ok).toBe(true);
      const second = (woken as { value: Awaited<ReturnType<LockService['lock']>> }).value;
      expect(performance.now() - releasedAt).toBeLessThan(500);
      tokens = [...tokens, held.fencingToken, second.fencingToken];
      expect(tokens).toEqual([...tokens].sort((x, y) => x - y));
      expect(new Set(tokens).size).toBe(3);
      expect(await second.release()).toBe(true);

      // A lock lost to expiry, then taken by the other: the expired holder's release is refused.
      const brief = await a.lock('order:3', { expire: 200 });
      await sleep(300);
      const next = await b.lock('order:3');
      expect(next.fencingToken).toBeGreaterThan(brief.fencingToken);
      expect(await brief.release()).toBe(false);
      expect(await next.release()).toBe(true);

      for (const app of apps.splice(0)) await app.close(); // QUIT: allowed to every user
      expect(await aclLog()).toEqual([]);
      // Only the fencing counters stay, under the prefix (and the data set's marker: see EPOCH_SCRIPT).
      for (const key of await keys()) expect(key).toMatch(/^dislock:#fence:(\{[0-9a-z]+\}|epoch)$/);
      expect(capture.text).not.toMatch(/NOPERM|no permissions/i);
    } finally {
      for (const app of apps) await app.close();
      capture.restore();
    }
  });

  it('the access check passes as that user, through a Nest app given the client, and leaves no key', async () => {
    await user('dislock', RULE);
    const client = connect('dislock');
    const moduleRef = await Test.createTestingModule({ imports: [DisLockModule.forRoot({ redis: client })] }).compile();
    const app = await moduleRef.init();
    try {
      const warn = vi.fn();
      const started = performance.now();
      await checkRedisAccess(client, 'dislock:', 2_000, { warn });
      expect(performance.now() - started).toBeLessThan(500);
      expect(warn).not.toHaveBeenCalled();
      const handle = await app.get(LockService).lock('after-check');
      expect(await handle.release()).toBe(true);
    } finally {
      await app.close();
    }
    // The lock's fencing counter stays (as every counter does); nothing of the probe does.
    expect(await keys()).toEqual([expect.stringMatching(/^dislock:#fence:\{[0-9a-z]+\}$/)]);
    expect(await aclLog()).toEqual([]);
  });

  it('replica acknowledgement (`replicas`) needs +wait, and nothing else', async () => {
    await admin.config('SET', 'repl-diskless-sync-delay', '0'); // the first sync at once, not after 5 s
    const replica = await RedisServer.start({ args: ['--replicaof', '127.0.0.1', String(server.port)] });
    const apps: { close(): Promise<void> }[] = [];
    try {
      const replicaAdmin = replica.client();
      expect(
        await eventually(
          async () => /master_link_status:up/.test(String(await replicaAdmin.info('replication'))),
          10_000,
        ),
      ).toBe(true);
      replicaAdmin.disconnect();
      const acquireAs = async (name: string): Promise<unknown> => {
        const moduleRef = await Test.createTestingModule({
          imports: [
            DisLockModule.forRoot({
              redis: `redis://${name}:${PASSWORD}@127.0.0.1:${server.port}`,
              replicas: { min: 1, timeout: 1_000 },
              operationTimeout: 2_000,
            }),
          ],
        }).compile();
        const app = await moduleRef.init();
        apps.push(app);
        const handle = await app.get(LockService).lock('replicated');
        return handle.release();
      };
      await user('with-wait', dislockAclRule('dislock:', { replicas: true }));
      expect(await acquireAs('with-wait')).toBe(true);
      expect(await aclLog()).toEqual([]);
      await user('without-wait', RULE);
      await expect(acquireAs('without-wait')).rejects.toBeInstanceOf(RedisUnavailableError);
      expect(await aclLog()).toEqual(['without-wait command wait (toplevel)']);
    } finally {
      for (const app of apps) await app.close();
      await replica.dispose();
    }
  });

  it('INFO is there for ioredis: without it, every connection warns that it skipped its ready check', async () => {
    await user('no-info', RULE.replace(' +info', ''));
    const capture = new Captured();
    try {
      const client = connect('no-info');
      await client.ping().catch(() => undefined);
      await checkRedisAccess(client, 'dislock:', 2_000);
      expect(capture.text).toMatch(/Skipping the ready check because INFO command fails/);
    } finally {
      capture.restore();
    }
  });

  describe('every part of the rule is needed: the access check names what is missing', () => {
    const commands = RULE.split(' ')
      .filter((part) => part.startsWith('+') && part !== '+info')
      .map((part) => part.slice(1));

    it.each(commands)('without +%s', async (command) => {
      const name = `no-${command}`;
      await user(name, RULE.replace(new RegExp(` \\+${command}(?= |$)`), ''));
      const client = connect(name);
      const result = await settle(checkRedisAccess(client, 'dislock:', 2_000));
      expect(result.ok).toBe(false);
      const error = (result as { error: unknown }).error as RedisAccessError;
      expect(error).toBeInstanceOf(RedisAccessError);
      expect(error.name).toBe('RedisAccessError');
      expect(error.denied).toEqual([`command '${command}'`]);
      expect(error.aclRule).toBe(RULE);
      expect(error.message).toContain(`command '${command}'`);
      expect(error.message).toContain(`ACL SETUSER ${name} ${RULE}`);
      expect(error.message).not.toContain(PASSWORD);
      expect(result.ms).toBeLessThan(1_000);
      expect(await keys()).toEqual([]);
    });

    it('without the key pattern: names the probe keys', async () => {
      await user('no-keys', RULE.replace('~dislock:*', '~other:*'));
      const error = await checkRedisAccess(connect('no-keys'), 'dislock:', 2_000).catch((e: unknown) => e);
      expect(error).toBeInstanceOf(RedisAccessError);
      const denied = (error as RedisAccessError).denied;
      expect(denied.length).toBeGreaterThanOrEqual(1);
      for (const item of denied) expect(item).toMatch(/^key "dislock:#probe:\{[0-9a-f]{16}\}(:fence)?"$/);
      expect((error as Error).message).toContain('~dislock:*');
      expect(await keys()).toEqual([]);
    });

    it('without the channel pattern: names the release channel', async () => {
      await user('no-channels', RULE.replace('&dislock:*', ''));
      const error = await checkRedisAccess(connect('no-channels'), 'dislock:', 2_000).catch((e: unknown) => e);
      expect(error).toBeInstanceOf(RedisAccessError);
      expect((error as RedisAccessError).denied).toEqual([
        expect.stringMatching(/^channel "dislock:#probe:\{[0-9a-f]{16}\}"$/),
      ]);
      expect((error as Error).message).toContain('&dislock:*');
      expect(await keys()).toEqual([]);
    });

    it('several missing at once are all named', async () => {
      await user('several', RULE.replace(' +hset', '').replace(' +time', '').replace(' +subscribe', ''));
      const error = (await checkRedisAccess(connect('several'), 'dislock:', 2_000).catch(
        (e: unknown) => e,
      )) as RedisAccessError;
      expect(error).toBeInstanceOf(RedisAccessError);
      expect([...error.denied].sort()).toEqual(["command 'hset'", "command 'subscribe'", "command 'time'"]);
      expect(await keys()).toEqual([]);
    });

    it('a client with its own ioredis keyPrefix: the rule and the names include it', async () => {
      await user('app-prefixed', dislockAclRule('app:dislock:').replace(' +del', ''));
      const client = connect('app-prefixed', { keyPrefix: 'app:' });
      const error = (await checkRedisAccess(client, 'dislock:', 2_000).catch((e: unknown) => e)) as RedisAccessError;
      expect(error).toBeInstanceOf(RedisAccessError);
      expect(error.denied).toEqual(["command 'del'"]);
      expect(error.aclRule).toBe(dislockAclRule('app:dislock:'));
      await user('app-prefixed', dislockAclRule('app:dislock:'));
      await expect(checkRedisAccess(client, 'dislock:', 2_000)).resolves.toBeUndefined();
      expect(await keys()).toEqual([]);
    });
  });

  it('EVALSHA allowed but EVAL refused: found even while the scripts are cached', async () => {
    // Load the scripts first, as another process would have: EVALSHA alone then works.
    await admin.script('LOAD', ACQUIRE_SCRIPT.source);
    await admin.script('LOAD', CHECK_SCRIPT.source);
    await user('no-eval', RULE.replace(' +eval ', ' '));
    const error = (await checkRedisAccess(connect('no-eval'), 'dislock:', 2_000).catch(
      (e: unknown) => e,
    )) as RedisAccessError;
    expect(error).toBeInstanceOf(RedisAccessError);
    expect(error.denied).toEqual(["command 'eval'"]);
    await admin.script('FLUSH');
  });
});

describe('access check: scripting disabled, Redis down or frozen', () => {
  let server: RedisServer | undefined;
  const clients: Redis[] = [];
  const client = (port: number, options: RedisOptions = {}): Redis => {
    const c = new Redis({ host: '127.0.0.1', port, ...options });
    c.on('error', () => undefined);
    clients.push(c);
    return c;
  };

  afterEach(async () => {
    for (const c of clients.splice(0)) c.disconnect();
    await server?.dispose();
    server = undefined;
  });

  it('EVAL and EVALSHA renamed away (scripting disabled): RedisAccessError naming scripting', async () => {
    server = await RedisServer.start({ args: ['--rename-command', 'EVALSHA', '', '--rename-command', 'EVAL', ''] });
    const error = (await checkRedisAccess(client(server.port), 'dislock:', 2_000).catch(
      (e: unknown) => e,
    )) as RedisAccessError;
    expect(error).toBeInstanceOf(RedisAccessError);
    expect(error.denied).toEqual(['scripting (EVAL/EVALSHA)']);
    expect(error.message).toMatch(/must allow EVAL and EVALSHA/);
    expect(error.cause).toBeInstanceOf(Error);
    const admin = server.client();
    expect(await admin.keys('*')).toEqual([]);
    admin.disconnect();
  });

  it('Redis down (connection refused): resolves within operationTimeout and logs one warning', async () => {
    server = await RedisServer.start();
    const port = server.port;
    await server.stop();
    const warn = vi.fn();
    const result = await settle(checkRedisAccess(client(port), 'dislock:', 300, { warn }));
    expect(result.ok).toBe(true);
    expect(result.ms).toBeGreaterThanOrEqual(290);
    expect(result.ms).toBeLessThan(300 + 500);
    expect(warn).toHaveBeenCalledTimes(1);
    expect(String(warn.mock.calls[0][0])).toMatch(
      /^Skipped the Redis access check: Redis did not answer within 300 ms/,
    );
  });

  it('Redis frozen (SIGSTOP) just as the probe lock is taken: resolves within operationTimeout; the probe is deleted once Redis answers again', async () => {
    server = await RedisServer.start();
    const frozen = server;
    const c = client(server.port);
    await c.ping();
    // Freeze the server as the acquire script goes out (after the DEL that proves it can clean up).
    const evalsha = c.evalsha.bind(c);
    vi.spyOn(c, 'evalsha').mockImplementationOnce((...args: Parameters<Redis['evalsha']>) => {
      frozen.pause();
      return evalsha(...args);
    });
    const warn = vi.fn();
    const result = await settle(checkRedisAccess(c, 'dislock:', 300, { warn }));
    expect(result.ok).toBe(true);
    expect(result.ms).toBeLessThan(300 + 500);
    expect(warn).toHaveBeenCalledTimes(1);
    expect(String(warn.mock.calls[0][0])).toMatch(/did not answer within 300 ms/);
    server.resume();
    // The acquisition runs now (EVALSHA, NOSCRIPT, then EVAL), and the cleanup DEL only after it.
    const admin = server.client();
    const calls = async (command: string): Promise<number> =>
      Number(new RegExp(`cmdstat_${command}:calls=(\\d+)`).exec(String(await admin.info('commandstats')))?.[1] ?? 0);
    try {
      expect(await eventually(async () => (await calls('eval')) === 1 && (await calls('del')) === 2, 3_000)).toBe(true);
      expect(await admin.keys('*')).toEqual([]);
    } finally {
      admin.disconnect();
    }
  });

  it('a wrong password: a warning (no RedisAccessError: it is not a permission), without the password', async () => {
    server = await RedisServer.start({ password: 'the-right-one' });
    const warn = vi.fn();
    const result = await settle(
      checkRedisAccess(client(server.port, { password: PASSWORD }), 'dislock:', 500, { warn }),
    );
    expect(result.ok).toBe(true);
    expect(warn).toHaveBeenCalledTimes(1);
    expect(String(warn.mock.calls[0][0])).toMatch(/WRONGPASS|did not answer/);
    expect(String(warn.mock.calls[0][0])).not.toContain(PASSWORD);
  });
});

describe('passwords never reach logs or errors', () => {
  let server: RedisServer;
  beforeAll(async () => {
    server = await RedisServer.start({ password: 'the-right-one' });
  });
  afterAll(async () => {
    await server?.dispose();
  });

  const cases: [string, () => DisLockModuleOptions['redis']][] = [
    ['a URL', () => `redis://:${PASSWORD}@127.0.0.1:${server.port}`],
    ['a URL with a user', () => `redis://someone:${PASSWORD}@127.0.0.1:${server.port}`],
    ['RedisOptions', () => ({ host: '127.0.0.1', port: server.port, password: PASSWORD })],
    [
      'RedisOptions over RESP3 (HELLO 3 AUTH)',
      () => ({ host: '127.0.0.1', port: server.port, password: PASSWORD, protocol: 3 }),
    ],
    [
      '{ url, ...options }',
      () => ({ url: `redis://someone:${PASSWORD}@127.0.0.1:${server.port}`, connectTimeout: 1_000 }),
    ],
  ];

  it.each(cases)(
    'a wrong password in %s: the lock fails with RedisUnavailableError; no log line, message, cause or stack holds it',
    async (_label, redis) => {
      const capture = new Captured();
      try {
        const moduleRef = await Test.createTestingModule({
          imports: [DisLockModule.forRoot({ redis: redis(), operationTimeout: 500 })],
        }).compile();
        const app = await moduleRef.init();
        const locks = app.get(LockService);
        const errors: unknown[] = [];
        errors.push(await locks.lock('x').catch((e: unknown) => e));
        await sleep(300); // the client is now between reconnect attempts
        errors.push(await locks.lock('y', { waitTime: 200 }).catch((e: unknown) => e));
        errors.push(await locks.withLock('z', () => 1).catch((e: unknown) => e));
        await app.close();
        for (const error of errors) {
          expect(error).toBeInstanceOf(RedisUnavailableError);
          expect(everythingAbout(error)).toMatch(/WRONGPASS|did not answer/);
          expect(everythingAbout(error)).not.toContain(PASSWORD);
        }
        expect(capture.text).toMatch(/WRONGPASS/); // the refusal was logged...
        expect(capture.text).not.toContain(PASSWORD); // ...without the password
      } finally {
        capture.restore();
      }
    },
  );

  // A client the application made and passed in gets no listener from the library, but its errors
  // keep ioredis's `command.args` (HELLO 3 AUTH user password): the store scrubs every error it
  // passes on, so RedisUnavailableError.cause carries no password.
  it('an app-provided client: the cause of RedisUnavailableError does not carry the password', async () => {
    const own = new Redis({ host: '127.0.0.1', port: server.port, password: PASSWORD, maxRetriesPerRequest: 1 });
    own.on('error', () => undefined);
    const moduleRef = await Test.createTestingModule({
      imports: [DisLockModule.forRoot({ redis: own, operationTimeout: 500 })],
    }).compile();
    const app = await moduleRef.init();
    try {
      const error = await app
        .get(LockService)
        .lock('x')
        .catch((e: unknown) => e);
      expect(error).toBeInstanceOf(RedisUnavailableError);
      expect(everythingAbout(error)).not.toContain(PASSWORD);
    } finally {
      await app.close();
      own.disconnect();
    }
  });

  it('a URL that does not parse: InvalidLockOptionsError at startup, without the URL or its password', async () => {
    const capture = new Captured();
    try {
      const error = await Test.createTestingModule({
        imports: [DisLockModule.forRoot({ redis: `redis://:${PASSWORD}@127.0.0.1:99999` })],
      })
        .compile()
        .then((moduleRef) => moduleRef.init())
        .catch((e: unknown) => e);
      expect(error).toBeInstanceOf(InvalidLockOptionsError);
      expect((error as InvalidLockOptionsError).option).toBe('redis');
      expect(everythingAbout(error)).not.toContain(PASSWORD);
      expect(capture.text).not.toContain(PASSWORD);
    } finally {
      capture.restore();
    }
  });

  // The validation error quotes a `redis` string it rejects with its user and password masked.
  it('a URL with a wrong scheme is not quoted with its password in the InvalidLockOptionsError', () => {
    let error: unknown;
    try {
      DisLockModule.forRoot({ redis: `http://:${PASSWORD}@127.0.0.1:6379` });
    } catch (e) {
      error = e;
    }
    expect(error).toBeInstanceOf(InvalidLockOptionsError);
    expect(everythingAbout(error)).not.toContain(PASSWORD);
  });
});

describe('least privilege on a Redis Cluster (3 masters, 3 replicas)', () => {
  const CLUSTER_RULE = dislockAclRule('dislock:', { cluster: true });
  let cluster: RedisCluster;
  const admins: Redis[] = [];
  const clients: Cluster[] = [];

  const setUser = async (name: string, rule: string): Promise<void> => {
    await Promise.all(
      admins.map((admin) => admin.call('ACL', 'SETUSER', name, 'reset', 'on', `>${PASSWORD}`, ...rule.split(' '))),
    );
  };
  const connect = (name: string): Cluster => {
    const client = new Cluster(cluster.seeds, { redisOptions: { username: name, password: PASSWORD } });
    client.on('error', () => undefined);
    clients.push(client);
    return client;
  };
  const aclLogs = async (): Promise<string[]> => {
    const all = await Promise.all(admins.map((admin) => admin.call('ACL', 'LOG') as Promise<unknown[][]>));
    return all.flatMap((entries, node) =>
      entries.map((entry) => {
        const fields = new Map<string, unknown>();
        for (let i = 0; i < entry.length; i += 2) fields.set(String(entry[i]), entry[i + 1]);
        return `node ${node}: ${String(fields.get('username'))} ${String(fields.get('reason'))} ${String(fields.get('object'))}`;
      }),
    );
  };

  beforeAll(async () => {
    cluster = await RedisCluster.start();
    for (const seed of cluster.seeds as { port: number }[]) {
      const admin = new Redis({ host: '127.0.0.1', port: seed.port, maxRetriesPerRequest: 1 });
      admin.on('error', () => undefined);
      admins.push(admin);
    }
  }, 30_000);

  afterEach(async () => {
    for (const client of clients.splice(0)) client.disconnect();
    await Promise.all(admins.map((admin) => admin.call('ACL', 'LOG', 'RESET')));
  });

  afterAll(async () => {
    for (const admin of admins) admin.disconnect();
    await cluster?.dispose();
  });

  it('the lifecycle and the access check as a user with only the Cluster rule, on every node; nothing refused', async () => {
    await setUser('dislock', CLUSTER_RULE);
    const apps: { close(): Promise<void> }[] = [];
    try {
      const start = async (): Promise<LockService> => {
        const moduleRef = await Test.createTestingModule({
          imports: [DisLockModule.forRoot({ redis: connect('dislock'), operationTimeout: 2_000 })],
        }).compile();
        const app = await moduleRef.init();
        apps.push(app);
        return app.get(LockService);
      };
      const [a, b] = [await start(), await start()];
      // Names on several slots, so that every master serves some.
      for (const name of ['order:1', 'order:2', 'order:3', 'order:4']) {
        await a.withLock(name, async (outer) => {
          await a.withLock(name, (inner) => expect(inner.fencingToken).toBe(outer.fencingToken));
        });
        const held = await a.lock(name);
        const waiting = settle(b.lock(name, { waitTime: 10_000 }));
        await sleep(100);
        expect(await held.release()).toBe(true);
        const woken = await waiting;
        expect(woken.ok).toBe(true);
        expect(woken.ms).toBeLessThan(2_000);
        expect(await (woken as { value: { release(): Promise<boolean> } }).value.release()).toBe(true);
      }
      const warn = vi.fn();
      await checkRedisAccess(connect('dislock'), 'dislock:', 2_000, { warn });
      expect(warn).not.toHaveBeenCalled();
      for (const app of apps.splice(0)) await app.close();
      expect(await aclLogs()).toEqual([]);
    } finally {
      for (const app of apps) await app.close();
    }
  });

  it.each(['spublish', 'ssubscribe', 'sunsubscribe'])('without +%s: the access check names it', async (command) => {
    const name = `no-${command}`;
    await setUser(name, CLUSTER_RULE.replace(` +${command}`, ''));
    const error = (await checkRedisAccess(connect(name), 'dislock:', 2_000).catch(
      (e: unknown) => e,
    )) as RedisAccessError;
    expect(error).toBeInstanceOf(RedisAccessError);
    expect(error.denied).toEqual([`command '${command}'`]);
    expect(error.aclRule).toBe(CLUSTER_RULE);
    expect(error.message).toContain('on every node');
  });
});
