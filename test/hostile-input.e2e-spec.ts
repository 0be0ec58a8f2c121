/**
 * Hostile or unlucky surroundings: owner ids an attacker would like to guess, a Redis that refuses
 * the password, TLS with the right and the wrong certificate authority. Private redis-servers
 * for everything but the owner ids; child processes where only a process of its own can tell
 * (unhandled rejections, a CA trusted through NODE_EXTRA_CA_CERTS, exiting by itself).
 */
import { tlsSupport } from './support/tls-certs';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Logger } from '@nestjs/common';
import { Redis, type RedisOptions } from 'ioredis';
import { RedisUnavailableError } from 'nestjs-dislock';
import { createTestApp, type TestApp } from './support/app';
import { settle } from './support/async';
import { freePort, RedisServer } from './support/redis-server';
import { uniquePrefix } from './support/shared-redis';
import { WorkerChild } from './support/workers/hostile-child-process';
import type { ErrorReport } from './support/workers/hostile-worker';
import { holdsOf } from './support/lock-hash';

const WORKER = 'hostile-worker.ts';

describe('owner ids', () => {
  it('are unguessable: 2,000 acquisitions give distinct 32-hex-digit ids with uniformly distributed digits', async () => {
    const t = await createTestApp();
    const owners: string[] = [];
    try {
      // 50 lanes, each taking and releasing its own name 40 times: an id per acquisition, not per name.
      await Promise.all(
        Array.from({ length: 50 }, async (_, lane) => {
          for (let round = 0; round < 40; round += 1) {
            const handle = await t.locks.lock(`owner:${lane}`);
            owners.push(handle.owner);
            expect(await handle.release()).toBe(true);
          }
        }),
      );
    } finally {
      await t.close();
    }

    expect(owners).toHaveLength(2_000);
    expect(new Set(owners).size).toBe(2_000);
    for (const owner of owners) expect(owner).toMatch(/^[0-9a-f]{32}$/);

    // Chi-square of the 64,000 hex digits against uniform (15 degrees of freedom, mean 15, sd 5.5):
    // 60 is exceeded by chance with probability < 1e-6. A counter, a timestamp or a version nibble
    // (as in UUID v4) puts it in the thousands.
    const HEX = '0123456789abcdef';
    const chiSquare = (counts: number[], total: number): number =>
      counts.reduce((sum, count) => sum + (count - total / 16) ** 2 / (total / 16), 0);
    const overall = new Array<number>(16).fill(0);
    const byPosition = Array.from({ length: 32 }, () => new Array<number>(16).fill(0));
    for (const owner of owners) {
      for (let i = 0; i < 32; i += 1) {
        const digit = HEX.indexOf(owner[i]);
        overall[digit] += 1;
        byPosition[i][digit] += 1;
      }
    }
    expect(chiSquare(overall, 64_000)).toBeLessThan(60);
    // Every position on its own (32 x 15 = 480 degrees of freedom, mean 480, sd 31): < 700 is 7 sd.
    // A single fixed position adds ~30,000; a position limited to 4 values adds ~6,000.
    const perPosition = byPosition.reduce((sum, counts) => sum + chiSquare(counts, 2_000), 0);
    expect(perPosition).toBeLessThan(700);
  });
});

describe('password-protected Redis', () => {
  let server: RedisServer | undefined;
  let worker: WorkerChild | undefined;

  afterEach(async () => {
    await worker?.kill();
    await server?.dispose();
    worker = undefined;
    server = undefined;
  });

  it.each([
    ['a wrong password', 'not-the-password', /WRONGPASS/],
    ['no password', undefined, /NOAUTH/],
  ])(
    'with %s: RedisUnavailableError naming the auth failure, bounded; no unhandled rejection; closes and exits by itself',
    async (_label, password, authError) => {
      server = await RedisServer.start({ password: 'the-password' });
      const keyPrefix = uniquePrefix('auth');
      worker = new WorkerChild(WORKER, {
        mode: 'wrong-password',
        redis: { host: '127.0.0.1', port: server.port, password },
        operationTimeout: 500,
        keyPrefix,
      });
      const closed = await worker.next('closed', 15_000);
      const closedAt = performance.now();
      const results = closed.results as (ErrorReport | 'ok')[];
      expect(results).toHaveLength(3); // lock, tryLock (waitTime 300), withLock
      for (const result of results) {
        expect(result).not.toBe('ok');
        const error = result as ErrorReport;
        expect(error).toMatchObject({
          ctor: 'RedisUnavailableError',
          isRedisUnavailable: true,
          isDisLockError: true,
          operation: 'acquire',
          statusCode: 503,
        });
        // The message may reach an HTTP client (Nest 11 sends it): it names the lock, not the failure;
        // the auth failure is in the cause, for logs.
        expect(error.message).toMatch(
          /^Could not acquire lock "auth": Redis (is unavailable|did not answer within 500 ms|is unreachable; nothing was sent)$/,
        );
        expect(error.cause).toMatch(authError);
        expect(error.ms).toBeLessThan(500 + 1_000); // operationTimeout, plus scheduling on a busy machine
      }
      // The module's client logged the refusal (once per outage, not once per retry).
      const authLogs = (closed.logs as string[]).filter((l) => authError.test(l));
      expect(authLogs.length).toBeGreaterThanOrEqual(1);
      expect(authLogs.length).toBeLessThanOrEqual(2);
      expect(closed.closeMs).toBeLessThan(1_000);

      // Nothing keeps the process alive (no reconnect timer, no socket), and nothing went unhandled.
      await worker.expectCleanExit(closedAt);

      const redis = server.client();
      try {
        expect(await redis.keys(`${keyPrefix}*`)).toEqual([]);
      } finally {
        redis.disconnect();
      }
    },
  );

  // Guards a fixed gap (a timed-out operation now names the connection error of a client the
  // module created, in its cause): once the
  // client's reconnect delay exceeds operationTimeout (ioredis backs off to 2 s within seconds of a
  // wrong password; here a fixed 1 s retryStrategy gets there at once), an acquisition waits in
  // the offline queue and fails with "Redis did not answer within 500 ms": the auth failure that
  // keeps the client down appears only in one log line, never in the error the caller gets.
  it('with a wrong password, acquisitions made while the client waits to reconnect still name the auth failure', async () => {
    server = await RedisServer.start({ password: 'the-password' });
    worker = new WorkerChild(WORKER, {
      mode: 'wrong-password',
      redis: { host: '127.0.0.1', port: server.port, password: 'not-the-password' },
      retryDelayMs: 1_000,
      operationTimeout: 500,
      keyPrefix: uniquePrefix('auth-late'),
    });
    const closed = await worker.next('closed', 15_000);
    const results = closed.results as ErrorReport[];
    for (const error of results) {
      expect(error).toMatchObject({ ctor: 'RedisUnavailableError', operation: 'acquire' });
      expect(error.ms).toBeLessThan(500 + 1_000);
    }
    // The first acquisition was queued before the AUTH reply: it gets WRONGPASS itself.
    expect(results[0].cause).toMatch(/WRONGPASS/);
    // The others reach a client that is waiting out its reconnect delay.
    expect(results.slice(1).map((error) => error.cause)).toEqual([
      expect.stringMatching(/WRONGPASS/),
      expect.stringMatching(/WRONGPASS/),
    ]);
    // None of it is in the message, which may reach an HTTP client.
    for (const error of results) expect(error.message).not.toMatch(/WRONGPASS/);
    expect(await worker.exitWithin(2_000)).toMatchObject({ code: 0 });
  });
});

// ---- TLS ----------------------------------------------------------------------------------------

interface Certificates {
  readonly dir: string;
  /** The CA that signed the server certificate. */
  readonly ca: string;
  /** A CA that signed nothing here. */
  readonly otherCa: string;
  readonly caFile: string;
  readonly certFile: string;
  readonly keyFile: string;
}

/** A throwaway CA and a server certificate for 127.0.0.1/localhost signed by it (EC keys: fast). */
function makeCertificates(): Certificates {
  const dir = mkdtempSync(join(tmpdir(), 'dislock-tls-'));
  const file = (name: string): string => join(dir, name);
  const openssl = (...args: string[]): void => void execFileSync('openssl', args, { stdio: 'ignore' });
  const ec = ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes'];
  openssl(
    'req',
    '-x509',
    ...ec,
    '-keyout',
    file('ca.key'),
    '-out',
    file('ca.crt'),
    '-days',
    '1',
    '-subj',
    '/CN=dislock test CA',
  );
  openssl(
    'req',
    '-x509',
    ...ec,
    '-keyout',
    file('other.key'),
    '-out',
    file('other.crt'),
    '-days',
    '1',
    '-subj',
    '/CN=other CA',
  );
  openssl('req', ...ec, '-keyout', file('server.key'), '-out', file('server.csr'), '-subj', '/CN=localhost');
  writeFileSync(file('server.ext'), 'subjectAltName=IP:127.0.0.1,DNS:localhost\n');
  openssl(
    'x509',
    '-req',
    '-in',
    file('server.csr'),
    '-CA',
    file('ca.crt'),
    '-CAkey',
    file('ca.key'),
    '-CAcreateserial',
    '-out',
    file('server.crt'),
    '-days',
    '1',
    '-extfile',
    file('server.ext'),
  );
  return {
    dir,
    ca: readFileSync(file('ca.crt'), 'utf8'),
    otherCa: readFileSync(file('other.crt'), 'utf8'),
    caFile: file('ca.crt'),
    certFile: file('server.crt'),
    keyFile: file('server.key'),
  };
}

const TLS = tlsSupport();
if (!TLS.ok) {
  // Visible in the run's output; the TLS tests below are skipped on this machine.
  console.warn(`TLS tests skipped: ${TLS.why}`);
}
const describeTls = TLS.ok ? describe : describe.skip;

describeTls('TLS (private redis-server with --tls-port)', () => {
  const warn = vi.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
  let certs: Certificates;
  let server: RedisServer;
  let tlsPort: number;
  /** Clients and apps a test opened; closed in afterEach whatever happened. */
  const clients: Redis[] = [];
  let app: TestApp | undefined;
  let worker: WorkerChild | undefined;

  /** A TLS client that trusts the test CA, for assertions on what Redis holds. */
  const tlsClient = (): Redis => {
    const client = new Redis({ host: '127.0.0.1', port: tlsPort, tls: { ca: certs.ca }, maxRetriesPerRequest: 1 });
    client.on('error', () => undefined);
    clients.push(client);
    return client;
  };

  beforeAll(async () => {
    certs = makeCertificates();
    tlsPort = await freePort();
    // The plain port stays open for RedisServer's readiness probe; every test talks to tlsPort.
    server = await RedisServer.start({
      args: [
        '--tls-port',
        String(tlsPort),
        '--tls-cert-file',
        certs.certFile,
        '--tls-key-file',
        certs.keyFile,
        '--tls-ca-cert-file',
        certs.caFile,
        '--tls-auth-clients',
        'no',
      ],
    });
  });

  afterEach(async () => {
    await app?.close();
    app = undefined;
    await worker?.kill();
    worker = undefined;
    for (const client of clients.splice(0)) client.disconnect();
  });

  afterAll(async () => {
    await server?.dispose();
    if (certs) rmSync(certs.dir, { recursive: true, force: true });
    warn.mockRestore();
  });

  it('the TLS port speaks only TLS (a plain client gets no answer there)', async () => {
    const plain = new Redis({
      host: '127.0.0.1',
      port: tlsPort,
      lazyConnect: true,
      maxRetriesPerRequest: 0,
      retryStrategy: () => null,
      connectTimeout: 1_000,
    });
    plain.on('error', () => undefined);
    clients.push(plain);
    const ping = await settle(Promise.race([plain.connect().then(() => plain.ping()), sleepReject(2_000)]));
    expect(ping.ok).toBe(false);
    expect(await tlsClient().ping()).toBe('PONG');
  });

  it('RedisOptions { host, port, tls: { ca } }: takes and releases a lock over TLS', async () => {
    app = await createTestApp([], {
      redis: { host: '127.0.0.1', port: tlsPort, tls: { ca: certs.ca } } satisfies RedisOptions,
      operationTimeout: 2_000,
    });
    const redis = tlsClient();
    const handle = await app.locks.lock('tls-options');
    expect(await holdsOf(redis, `${app.prefix}tls-options`)).toEqual({ [handle.owner]: '1' });
    expect(await handle.release()).toBe(true);
    expect(await redis.exists(`${app.prefix}tls-options`)).toBe(0);
  });

  it('a client made from a rediss:// URL + tls options, passed in: takes and releases a lock, stays open', async () => {
    const own = new Redis(`rediss://127.0.0.1:${tlsPort}`, { tls: { ca: certs.ca }, maxRetriesPerRequest: 1 });
    own.on('error', () => undefined);
    clients.push(own);
    app = await createTestApp([], { redis: own, operationTimeout: 2_000 });
    const redis = tlsClient();
    const handle = await app.locks.lock('tls-client');
    expect(await holdsOf(redis, `${app.prefix}tls-client`)).toEqual({ [handle.owner]: '1' });
    expect(await handle.release()).toBe(true);
    expect(await redis.exists(`${app.prefix}tls-client`)).toBe(0);
    await app.close();
    app = undefined;
    expect(await own.ping()).toBe('PONG'); // the application's client is the application's to close
  });

  it('a rediss:// URL string, with the CA trusted through NODE_EXTRA_CA_CERTS: takes and releases a lock', async () => {
    const keyPrefix = uniquePrefix('tls-url');
    worker = new WorkerChild(
      WORKER,
      { mode: 'hold', redis: `rediss://127.0.0.1:${tlsPort}`, operationTimeout: 2_000, keyPrefix },
      { env: { NODE_EXTRA_CA_CERTS: certs.caFile }, stdin: true },
    );
    const held = await worker.next('held', 15_000);
    expect(held.key).toBe(`${keyPrefix}over-tls`);
    const redis = tlsClient();
    expect(await holdsOf(redis, held.key as string)).toEqual({ [held.owner as string]: '1' });
    worker.send('release');
    const closed = await worker.next('closed', 5_000);
    expect(closed.released).toBe(true);
    expect(await redis.exists(held.key as string)).toBe(0);
    const exit = await worker.exitWithin(2_000);
    expect(exit?.code).toBe(0);
    expect((await worker.next('exit', 100)).unhandled).toEqual([]);
  });

  it.each<[string, () => string | RedisOptions]>([
    [
      'a CA that did not sign the server certificate',
      () => ({ host: '127.0.0.1', port: tlsPort, tls: { ca: certs.otherCa } }),
    ],
    ['no CA (a rediss:// URL, system roots only)', () => `rediss://127.0.0.1:${tlsPort}`],
    [
      'the right CA but another server name',
      () => ({ host: '127.0.0.1', port: tlsPort, tls: { ca: certs.ca, servername: 'not-this-server.example' } }),
    ],
  ])('%s: RedisUnavailableError within a bounded time, and the app closes promptly', async (_label, redisOption) => {
    app = await createTestApp([], { redis: redisOption(), operationTimeout: 500 });
    const key = `${app.prefix}tls-refused`;
    const result = await settle(app.locks.lock('tls-refused'));
    expect(result.ok).toBe(false);
    expect((result as { error: unknown }).error).toBeInstanceOf(RedisUnavailableError);
    expect(result.ms).toBeLessThan(500 + 1_000);
    const closing = settle(app.close());
    app = undefined;
    expect((await closing).ms).toBeLessThan(1_000);
    expect(await tlsClient().exists(key)).toBe(0);
  });
});

function sleepReject(ms: number): Promise<never> {
  return new Promise((_, reject) => setTimeout(() => reject(new Error(`no answer within ${ms} ms`)), ms).unref());
}
