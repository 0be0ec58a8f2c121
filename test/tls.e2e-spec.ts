/**
 * TLS as managed Redis runs it: a redis-server with no plain port (`--port 0`) that requires a
 * client certificate (`--tls-auth-clients yes`), and a least-privilege ACL user. The library
 * connects by options (`tls: { ca, cert, key, servername }`) and by URL plus options
 * (`{ url: 'rediss://user:pass@host:port', tls }`): the lock lifecycle, pub/sub wake-ups and the
 * access check all work over it. A wrong CA, a missing or foreign client certificate, or another
 * server name fail within operationTimeout with RedisUnavailableError, and nothing hangs. A throwaway
 * PKI is made by openssl at test time.
 */
import { inspect } from 'node:util';
import { Logger } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import { Redis, type RedisOptions } from 'ioredis';
import { DisLockModule, type DisLockModuleOptions, LockService, RedisUnavailableError } from 'nestjs-dislock';
import { checkRedisAccess } from '../lib/store/redis/access.check';
import { dislockAclRule } from '../lib/store/redis/acl.rule';
import { settle } from './support/async';
import { eventually } from './support/shared-redis';
import { makeTestPki, type TestPki, TlsRedisServer, tlsSupport } from './support/tls-certs';
import { holdsOf } from './support/lock-hash';

const TLS = tlsSupport();
if (!TLS.ok) console.warn(`TLS tests skipped: ${TLS.why}`);
const describeTls = TLS.ok ? describe : describe.skip;

const USER = 'dislock';
const PASSWORD = 'Tls-Test-Secret-b41e07';

describeTls('TLS-only redis-server with client certificates', () => {
  let pki: TestPki;
  let server: TlsRedisServer;
  let admin: Redis;
  const apps: { close(): Promise<void> }[] = [];
  const clients: Redis[] = [];

  /** What the application passes: the CA, its certificate and key, and the name the server's certificate has. */
  const tls = (): NonNullable<RedisOptions['tls']> => ({
    ca: pki.ca,
    cert: pki.clientCert,
    key: pki.clientKey,
    servername: 'localhost',
  });

  const start = async (redis: DisLockModuleOptions['redis'], operationTimeout = 2_000): Promise<LockService> => {
    const moduleRef = await Test.createTestingModule({
      imports: [DisLockModule.forRoot({ redis, operationTimeout })],
    }).compile();
    const app = await moduleRef.init();
    apps.push(app);
    return app.get(LockService);
  };

  const rawClient = (options: RedisOptions): Redis => {
    const client = new Redis({ maxRetriesPerRequest: 1, ...options });
    client.on('error', () => undefined);
    clients.push(client);
    return client;
  };

  beforeAll(async () => {
    pki = makeTestPki();
    server = await TlsRedisServer.start(pki);
    admin = rawClient({ host: '127.0.0.1', port: server.port, tls: tls() });
    await admin.call('ACL', 'SETUSER', USER, 'reset', 'on', `>${PASSWORD}`, ...dislockAclRule('dislock:').split(' '));
  });

  afterEach(async () => {
    for (const app of apps.splice(0)) await app.close();
    for (const client of clients.splice(1)) client.disconnect(); // all but admin
    await admin.flushall();
  });

  afterAll(async () => {
    admin?.disconnect();
    await server?.dispose();
    pki?.dispose();
  });

  it('speaks only TLS, and only to clients with a certificate from its CA', async () => {
    const noAnswer = async (options: RedisOptions): Promise<void> => {
      const client = rawClient({
        host: '127.0.0.1',
        port: server.port,
        lazyConnect: true,
        maxRetriesPerRequest: 0,
        retryStrategy: () => null,
        connectTimeout: 1_000,
        ...options,
      });
      const ping = await settle(
        Promise.race([
          client.connect().then(() => client.ping()),
          new Promise((_, reject) => setTimeout(reject, 2_000)),
        ]),
      );
      expect(ping.ok).toBe(false);
    };
    await noAnswer({}); // plain TCP
    await noAnswer({ tls: { ca: pki.ca, servername: 'localhost' } }); // no client certificate
    await noAnswer({
      tls: { ca: pki.ca, cert: pki.otherClientCert, key: pki.otherClientKey, servername: 'localhost' },
    });
    expect(await admin.ping()).toBe('PONG');
  });

  it('by options { host, port, username, password, tls: { ca, cert, key, servername } }: lock, wait woken by pub/sub, release', async () => {
    const redis: RedisOptions = {
      host: '127.0.0.1',
      port: server.port,
      username: USER,
      password: PASSWORD,
      tls: { ca: pki.ca, cert: pki.clientCert, key: pki.clientKey, servername: 'localhost' },
    };
    const [a, b] = [await start(redis), await start(redis)];
    const held = await a.lock('order:1');
    expect(await holdsOf(admin, 'dislock:order:1')).toEqual({ [held.owner]: '1' });
    const waiting = settle(b.lock('order:1', { waitTime: 10_000 }));
    expect(await eventually(async () => (await admin.pubsub('NUMSUB', 'dislock:order:1'))[1] === 1)).toBe(true);
    const releasedAt = performance.now();
    expect(await held.release()).toBe(true);
    const woken = await waiting;
    expect(woken.ok).toBe(true);
    // Only the release announcement wakes it this soon: not the 30 s lease, nor its refresh of its
    // place in the line 1 s after its last attempt (just before the release; 2 s from the start
    // let that one pass too).
    expect(performance.now() - releasedAt).toBeLessThan(500);
    const second = (woken as { value: Awaited<ReturnType<LockService['lock']>> }).value;
    expect(second.fencingToken).toBeGreaterThan(held.fencingToken);
    expect(await second.release()).toBe(true);
    expect(await admin.exists('dislock:order:1')).toBe(0);
  });

  it("by URL plus options { url: 'rediss://user:pass@host:port', tls }: lock, re-entry, release", async () => {
    const locks = await start({ url: `rediss://${USER}:${PASSWORD}@127.0.0.1:${server.port}`, tls: tls() });
    await locks.withLock('order:2', async (outer) => {
      expect(await holdsOf(admin, 'dislock:order:2')).toEqual({ [outer.owner]: '1' });
      await locks.withLock('order:2', (inner) => expect(inner.owner).toBe(outer.owner));
    });
    expect(await admin.exists('dislock:order:2')).toBe(0);
  });

  it("a redis:// URL with tls options still uses TLS; the URL's own parts win over the same options", async () => {
    const locks = await start({
      url: `redis://${USER}:${PASSWORD}@127.0.0.1:${server.port}`,
      tls: tls(),
      port: 1, // the URL names the port: this is ignored
      password: 'not-this-one',
    });
    const handle = await locks.lock('order:3');
    expect(await handle.release()).toBe(true);
  });

  it('the access check passes over TLS as the least-privilege user', async () => {
    const client = rawClient({ host: '127.0.0.1', port: server.port, username: USER, password: PASSWORD, tls: tls() });
    const warn = vi.fn();
    await checkRedisAccess(client, 'dislock:', 2_000, { warn });
    expect(warn).not.toHaveBeenCalled();
    expect(await admin.keys('*')).toEqual([]);
  });

  describe('refused TLS: RedisUnavailableError within operationTimeout, prompt shutdown, no password anywhere', () => {
    const cases: [string, () => DisLockModuleOptions['redis']][] = [
      ['a CA that did not sign the server certificate', () => ({ url: rediss(), tls: { ...tls(), ca: pki.otherCa } })],
      ['no client certificate', () => ({ url: rediss(), tls: { ca: pki.ca, servername: 'localhost' } })],
      [
        'a client certificate from another CA',
        () => ({ url: rediss(), tls: { ...tls(), cert: pki.otherClientCert, key: pki.otherClientKey } }),
      ],
      ['another server name', () => ({ url: rediss(), tls: { ...tls(), servername: 'not-this-server.example' } })],
      ['a bare rediss:// URL (no CA, no client certificate)', () => rediss()],
      [
        'options without tls against the TLS port',
        () => ({ host: '127.0.0.1', port: server.port, username: USER, password: PASSWORD, connectTimeout: 1_000 }),
      ],
    ];
    const rediss = (): string => `rediss://${USER}:${PASSWORD}@127.0.0.1:${server.port}`;

    it.each(cases)('%s', async (_label, redis) => {
      const logged: string[] = [];
      const spies = (['log', 'warn', 'error'] as const).map((level) =>
        vi
          .spyOn(Logger.prototype, level)
          .mockImplementation((...args: unknown[]) => void logged.push(inspect(args, { depth: 10 }))),
      );
      try {
        const locks = await start(redis(), 500);
        const result = await settle(locks.lock('refused'));
        expect(result.ok).toBe(false);
        const error = (result as { error: unknown }).error;
        expect(error).toBeInstanceOf(RedisUnavailableError);
        expect(result.ms).toBeLessThan(500 + 1_000);
        expect(inspect(error, { depth: 20, showHidden: true })).not.toContain(PASSWORD);
        const closing = settle(Promise.all(apps.splice(0).map((app) => app.close())));
        expect((await closing).ms).toBeLessThan(1_000);
        expect(logged.join('\n')).not.toContain(PASSWORD);
        expect(await admin.keys('*')).toEqual([]);
      } finally {
        for (const spy of spies) spy.mockRestore();
      }
    });

    it('the access check on such a client: a warning within operationTimeout, no exception', async () => {
      const client = rawClient({
        host: '127.0.0.1',
        port: server.port,
        username: USER,
        password: PASSWORD,
        tls: { ca: pki.otherCa, cert: pki.clientCert, key: pki.clientKey, servername: 'localhost' },
      });
      const warn = vi.fn();
      const result = await settle(checkRedisAccess(client, 'dislock:', 500, { warn }));
      expect(result.ok).toBe(true);
      expect(result.ms).toBeLessThan(500 + 500);
      expect(warn).toHaveBeenCalledTimes(1);
      expect(String(warn.mock.calls[0][0])).not.toContain(PASSWORD);
    });

    it('a wrong password over TLS, in the URL and in options: RedisUnavailableError naming WRONGPASS in its cause only', async () => {
      for (const redis of [
        { url: `rediss://${USER}:${PASSWORD}-wrong@127.0.0.1:${server.port}`, tls: tls() },
        { host: '127.0.0.1', port: server.port, username: USER, password: `${PASSWORD}-wrong`, tls: tls() },
      ]) {
        const locks = await start(redis, 500);
        const error = await locks.lock('x').catch((e: unknown) => e);
        expect(error).toBeInstanceOf(RedisUnavailableError);
        const text = inspect(error, { depth: 20, showHidden: true });
        expect(text).toMatch(/WRONGPASS/);
        expect(text).not.toContain(PASSWORD);
      }
    });
  });
});
