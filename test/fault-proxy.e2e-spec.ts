/**
 * The fault proxy itself (test/support/fault-proxy.ts): that it passes Redis traffic through
 * unchanged, keeps replies matched to commands whatever the chunking or protocol version, and that
 * every fault does what it says, seen from real ioredis clients and a real redis-server. Runs on a
 * redis-server of its own (with DEBUG enabled, for `DEBUG PROTOCOL`'s RESP3 types).
 */
import { createHash, randomBytes } from 'node:crypto';
import { connect, type Socket } from 'node:net';
import { runInThisContext } from 'node:vm';
import { Redis, type RedisOptions } from 'ioredis';
import { FaultCancelledError, FaultProxy, isCommand, isScript, type SeenCommand } from './support/fault-proxy';
import { RedisServer } from './support/redis-server';
import { eventually, sleep } from './support/shared-redis';

/** The real `process`, whatever sandbox the test runner gives test files. */
const realProcess = runInThisContext('process') as NodeJS.Process;

const script = (source: string): { sha: string; source: string } => ({
  source,
  sha: createHash('sha1').update(source).digest('hex'),
});

/** A raw connection, for what ioredis cannot send or read (inline commands, RESP3, split writes). */
interface RawConnection {
  readonly socket: Socket;
  /** Everything received so far, as latin1 text (byte for byte). */
  text(): string;
  /** Resolves once the received text ends with `suffix`. */
  until(suffix: string, timeoutMs?: number): Promise<void>;
}

describe('FaultProxy', () => {
  let server: RedisServer;
  let direct: Redis;
  let proxy: FaultProxy;
  const clients: Redis[] = [];
  const sockets: Socket[] = [];

  /** An ioredis client through the proxy; it reconnects fast so tests stay short. */
  function client(options: RedisOptions = {}): Redis {
    const redis = new Redis({ host: '127.0.0.1', port: proxy.port, retryStrategy: () => 10, ...options });
    redis.on('error', () => undefined);
    clients.push(redis);
    return redis;
  }

  async function raw(port = proxy.port): Promise<RawConnection> {
    const socket = connect({ port, host: '127.0.0.1' });
    sockets.push(socket);
    socket.setNoDelay(true);
    socket.on('error', () => undefined);
    const chunks: Buffer[] = [];
    socket.on('data', (chunk: Buffer) => chunks.push(chunk));
    await new Promise<void>((resolve) => socket.once('connect', () => resolve()));
    const text = (): string => Buffer.concat(chunks).toString('latin1');
    return {
      socket,
      text,
      until: async (suffix, timeoutMs = 2_000) => {
        if (!(await eventually(() => text().endsWith(suffix), timeoutMs, 5))) {
          throw new Error(`never received ${JSON.stringify(suffix)}; got ${JSON.stringify(text().slice(-200))}`);
        }
      },
    };
  }

  /** The connection numbers of the logged commands `match` accepts, in order. */
  const connectionsOf = (match: (argv: readonly string[]) => boolean): number[] =>
    proxy.log.filter((seen) => match(seen.argv)).map((seen) => seen.connection);

  beforeAll(async () => {
    server = await RedisServer.start({ args: ['--enable-debug-command', 'yes'] });
    direct = server.client();
  });

  afterAll(async () => {
    direct.disconnect();
    await server.dispose();
  });

  beforeEach(async () => {
    await direct.flushall();
    proxy = await FaultProxy.start(server.port);
  });

  afterEach(async () => {
    // Clients first: a client whose proxy is gone would keep retrying.
    for (const redis of clients.splice(0)) redis.disconnect();
    for (const socket of sockets.splice(0)) socket.destroy();
    await proxy.close();
  });

  it('passes pipelined commands with 1 MB values, an EVAL and every RESP2 reply type through unchanged', async () => {
    const redis = client();
    const values = Array.from({ length: 6 }, () => randomBytes(768 * 1024).toString('base64')); // 1 MB each
    const pipeline = redis.pipeline();
    values.forEach((value, i) => pipeline.set(`big:${i}`, value));
    values.forEach((_value, i) => pipeline.get(`big:${i}`));
    pipeline
      .eval("return {1, 'two', {3, {'four'}}, redis.call('get', KEYS[1])}", 1, 'big:0')
      .get('missing') // $-1
      .blpop('empty', 0.01) // *-1
      .incr('big:0') // -ERR
      .strlen('big:5'); // :integer
    // The reply behind six 1 MB bulk strings (split over many chunks) must still be the EVAL's.
    const evalDelayed = proxy.delayReply(isCommand('eval'), 150);
    const results = await pipeline.exec();

    expect(results).not.toBeNull();
    const replies = (results ?? []).map(([, reply]) => reply);
    const errors = (results ?? []).map(([error]) => error);
    expect(replies.slice(0, 6)).toEqual(values.map(() => 'OK'));
    expect(replies.slice(6, 12)).toEqual(values);
    expect(replies[12]).toEqual([1, 'two', [3, ['four']], values[0]]);
    expect(replies.slice(13, 15)).toEqual([null, null]);
    expect(String(errors[15])).toMatch(/not an integer/);
    expect(replies[16]).toBe(values[5].length);
    expect((await evalDelayed).argv[0]).toBe('eval');
    expect(await direct.get('big:3')).toBe(values[3]);

    const sets = proxy.log.filter((seen) => seen.argv[0] === 'set');
    expect(sets.map((seen) => seen.argv)).toEqual(values.map((value, i) => ['set', `big:${i}`, value]));
    expect(new Set(proxy.log.map((seen) => seen.connection))).toEqual(new Set([1]));
  });

  it('parses commands written a byte at a time and inline commands, and matches them', async () => {
    const connection = await raw();
    const delayed = proxy.delayReply(isCommand('echo', 'split'), 200);
    const started = performance.now();
    for (const byte of Buffer.from('*2\r\n$4\r\nECHO\r\n$5\r\nsplit\r\nPING\r\n')) {
      connection.socket.write(Buffer.of(byte));
      await new Promise((resolve) => setImmediate(resolve));
    }
    await connection.until('$5\r\nsplit\r\n+PONG\r\n');

    expect(performance.now() - started).toBeGreaterThanOrEqual(190);
    expect(await delayed).toEqual({ argv: ['ECHO', 'split'], connection: 1 });
    expect(proxy.log.map((seen) => seen.argv)).toEqual([['ECHO', 'split'], ['PING']]);
  });

  it('forwards RESP3 replies (attributes, pushes, maps, sets, bignums, verbatim) byte for byte and stays in step', async () => {
    const types = ['attrib', 'push', 'map', 'set', 'bignum', 'verbatim', 'double', 'true', 'null'];
    const request =
      'HELLO 3\r\n' + types.map((type) => `DEBUG PROTOCOL ${type}\r\n`).join('') + 'ECHO last\r\nECHO after\r\n';
    // What Redis sends without the proxy (the HELLO reply carries the connection's id: normalised).
    const reference = await raw(server.port);
    reference.socket.write(request);
    await reference.until('$5\r\nafter\r\n');
    const normalise = (text: string): string => text.replace(/\$2\r\nid\r\n:\d+\r\n/, '$2\r\nid\r\n:N\r\n');

    const connection = await raw();
    const delayed = proxy.delayReply(isCommand('echo', 'last'), 300);
    const started = performance.now();
    connection.socket.write(request);
    // Everything before ECHO last arrives at once; if a RESP3 type had put the proxy out of step,
    // the hold would sit on some other reply.
    await connection.until('_\r\n', 250);
    expect(connection.text()).not.toContain('last');
    await connection.until('$5\r\nafter\r\n');

    expect(performance.now() - started).toBeGreaterThanOrEqual(290);
    expect((await delayed).argv).toEqual(['ECHO', 'last']);
    expect(normalise(connection.text())).toBe(normalise(reference.text()));
  });

  it('dropReply (reset): Redis runs INCR once, ioredis re-sends it on the new connection, the counter ends at 2', async () => {
    const redis = client();
    await redis.ping();
    const dropped = proxy.dropReply(isCommand('incr', 'counter'));

    expect(await redis.incr('counter')).toBe(2);
    expect(await dropped).toEqual({ argv: ['incr', 'counter'], connection: 1 });
    expect(await direct.get('counter')).toBe('2');
    expect(connectionsOf(isCommand('incr'))).toEqual([1, 2]);
  });

  it('dropReply (reset) with autoResendUnfulfilledCommands: false: the INCR fails and the counter stays at 1', async () => {
    const redis = client({ autoResendUnfulfilledCommands: false, maxRetriesPerRequest: 0 });
    await redis.ping();
    const dropped = proxy.dropReply(isCommand('incr', 'counter'));

    await expect(redis.incr('counter')).rejects.toThrow();
    await dropped;
    expect(await eventually(() => redis.status === 'ready')).toBe(true);
    expect(await redis.get('counter')).toBe('1');
    expect(connectionsOf(isCommand('incr'))).toEqual([1]);
  });

  it('faults apply in the order they were armed, one command each', async () => {
    const redis = client();
    await redis.ping();
    const dropped = proxy.dropReply(isCommand('incr'));
    const delayed = proxy.delayReply(isCommand('incr'), 250);
    const started = performance.now();

    // The first INCR's reply is dropped; its re-sent copy is the next INCR, and gets the delay.
    expect(await redis.incr('counter')).toBe(2);
    expect(performance.now() - started).toBeGreaterThanOrEqual(240);
    expect((await dropped).connection).toBe(1);
    expect((await delayed).connection).toBe(2);
    // Both faults are used up: the next INCR is plain.
    const next = performance.now();
    expect(await redis.incr('counter')).toBe(3);
    expect(performance.now() - next).toBeLessThan(200);
  });

  it('dropReply (stall): the connection stays open, later commands reach Redis unanswered, until it is reset', async () => {
    await direct.set('stalled', 'value');
    const redis = client();
    await redis.ping();
    const dropped = proxy.dropReply(isCommand('get', 'stalled'), { then: 'stall' });
    const answered: string[] = [];
    const get = redis.get('stalled').then((value) => answered.push(`get ${value}`));
    await dropped;
    const set = redis.set('later', 'reached').then((reply) => answered.push(`set ${reply}`));

    expect(await eventually(async () => (await direct.get('later')) === 'reached')).toBe(true);
    await sleep(200);
    expect(answered).toEqual([]);
    expect(proxy.connectionCount).toBe(1);
    expect(redis.status).toBe('ready');

    expect(proxy.resetConnections('command')).toBe(1);
    await Promise.all([get, set]); // re-sent by ioredis on its new connection
    expect(answered).toEqual(['get value', 'set OK']);
    expect(connectionsOf(isCommand('get', 'stalled'))).toEqual([1, 2]);
  });

  it('delayReply holds the reply and those behind it on its connection, in order; other connections flow', async () => {
    await direct.mset('a', '1', 'b', '2');
    const redis = client();
    const other = client();
    await Promise.all([redis.ping(), other.ping()]);
    const delayed = proxy.delayReply(isCommand('get', 'a'), 400);
    const started = performance.now();
    const arrivals: { what: string; ms: number }[] = [];
    const note = (what: string) => (): void => void arrivals.push({ what, ms: performance.now() - started });

    const replies = Promise.all([
      redis.get('a').finally(note('get a')),
      redis.get('b').finally(note('get b')),
      redis.get('a').finally(note('second get a')), // the fault is used up, but this reply queues behind
    ]);
    void delayed.then(note('delayed resolved'));
    expect(await other.get('b')).toBe('2');
    note('other connection')();

    expect(await replies).toEqual(['1', '2', '1']);
    await delayed;
    await eventually(() => arrivals.length === 5);
    const at = Object.fromEntries(arrivals.map(({ what, ms }) => [what, ms]));
    expect(at['other connection']).toBeLessThan(300);
    expect(at['get a']).toBeGreaterThanOrEqual(390);
    expect(at['get b']).toBeGreaterThanOrEqual(390);
    expect(at['second get a']).toBeGreaterThanOrEqual(390);
    expect(at['delayed resolved']).toBeGreaterThanOrEqual(390);
    const clientOrder = arrivals.map(({ what }) => what).filter((what) => what !== 'delayed resolved');
    expect(clientOrder).toEqual(['other connection', 'get a', 'get b', 'second get a']);
  });

  it('delayReply with requestMs holds the command on its way first: Redis runs it that much later', async () => {
    const redis = client();
    const other = client();
    await Promise.all([redis.ping(), other.ping()]);
    const delayed = proxy.delayReply(isCommand('incr', 'held'), 100, { requestMs: 200 });
    const started = performance.now();
    const value = redis.incr('held');
    // When Redis has it, as a client of its own sees (another connection through the proxy flows meanwhile).
    let ranAfter = 0;
    expect(await other.ping()).toBe('PONG');
    expect(
      await eventually(
        async () => (await direct.get('held')) !== null && (ranAfter = performance.now() - started) > 0,
        2_000,
        2,
      ),
    ).toBe(true);
    expect(ranAfter).toBeGreaterThanOrEqual(195);
    expect(await value).toBe(1);
    expect(performance.now() - started).toBeGreaterThanOrEqual(295);
    await delayed;
    expect(() => proxy.delayReply(isCommand('get'), 1, { requestMs: -1 })).toThrow(RangeError);
  });

  it('matches a command when it goes to Redis: one sent before the fault was armed is not matched', async () => {
    const redis = client();
    await redis.ping();
    const first = redis.blpop('queue', 5);
    await eventually(() => connectionsOf(isCommand('blpop')).length === 1);
    // The first BLPOP is waiting in Redis now; its reply comes after the fault is armed.
    const delayed = proxy.delayReply(isCommand('blpop'), 300);
    let started = performance.now();
    await direct.lpush('queue', 'one');
    expect(await first).toEqual(['queue', 'one']);
    expect(performance.now() - started).toBeLessThan(250);

    await direct.lpush('queue', 'two');
    started = performance.now();
    expect(await redis.blpop('queue', 5)).toEqual(['queue', 'two']);
    expect(performance.now() - started).toBeGreaterThanOrEqual(290);
    expect((await delayed).argv).toEqual(['blpop', 'queue', '5']);
  });

  it("resetConnections('subscriber') makes ioredis resubscribe and leaves the command connection alone", async () => {
    const subscriber = client();
    const commands = client();
    const messages: string[] = [];
    subscriber.on('message', (_channel: string, message: string) => messages.push(message));
    await subscriber.subscribe('news');
    await commands.ping();
    let commandCloses = 0;
    commands.on('close', () => (commandCloses += 1));
    const commandConnection = connectionsOf(isCommand('ping')).at(-1);
    const big = randomBytes(96 * 1024).toString('hex');
    await direct.publish('news', big);
    expect(await eventually(() => messages.includes(big))).toBe(true);

    expect(proxy.resetConnections('subscriber')).toBe(1);
    expect(await eventually(() => connectionsOf(isCommand('subscribe', 'news')).length === 2)).toBe(true);
    expect(await eventually(async () => (await direct.pubsub('NUMSUB', 'news'))[1] === 1)).toBe(true);
    await direct.publish('news', 'after the reset');
    expect(await eventually(() => messages.includes('after the reset'))).toBe(true);

    await commands.ping();
    expect(connectionsOf(isCommand('ping')).at(-1)).toBe(commandConnection);
    expect(commandCloses).toBe(0);

    // The other way round: the subscriber is untouched by a reset of command connections.
    expect(proxy.resetConnections('command')).toBe(1);
    await direct.publish('news', 'still subscribed');
    expect(await eventually(() => messages.includes('still subscribed'))).toBe(true);
    expect(connectionsOf(isCommand('subscribe'))).toHaveLength(2);
  });

  it('blackhole: nothing passes for its duration, new connections included; then everything flows, in order', async () => {
    const redis = client();
    await redis.ping();
    proxy.clearLog();
    const hole = proxy.blackhole(400);
    const started = performance.now();
    const replies = Promise.all([redis.set('k', 'v'), redis.get('k')]);
    const late = client();
    const lateReady = new Promise<number>((resolve) => late.once('ready', () => resolve(performance.now() - started)));

    await sleep(200);
    expect(proxy.log).toEqual([]);
    expect(await direct.exists('k')).toBe(0);

    expect(await replies).toEqual(['OK', 'v']);
    expect(performance.now() - started).toBeGreaterThanOrEqual(390);
    expect(await lateReady).toBeGreaterThanOrEqual(390);
    await hole;
    expect(await late.ping()).toBe('PONG');
    expect(connectionsOf(isCommand('set'))).toEqual([1]);
    expect(proxy.connectionCount).toBe(2);
  });

  it('blackhole with thenReset: the held bytes are discarded and every connection is destroyed', async () => {
    const redis = client();
    await redis.ping();
    const hole = proxy.blackhole(300, { thenReset: true });
    const incr = redis.incr('counter');

    await sleep(150);
    expect(connectionsOf(isCommand('incr'))).toEqual([]);
    await hole;
    // The INCR never reached Redis through the first connection; ioredis re-sent it on its new one.
    expect(await incr).toBe(1);
    expect(await direct.get('counter')).toBe('1');
    expect(connectionsOf(isCommand('incr'))).toEqual([2]);
  });

  it('isCommand and isScript match as documented', () => {
    const mine = script("return 'mine'");
    const theirs = script("return 'theirs'");
    expect(isCommand('GET', 'k')(['get', 'k'])).toBe(true);
    expect(isCommand('get')(['GET', 'anything'])).toBe(true);
    expect(isCommand('get', 'k')(['get', 'K'])).toBe(false);
    expect(isCommand('get', 'k')(['get'])).toBe(false);
    expect(isCommand('get', 'k')(['set', 'k'])).toBe(false);
    expect(isScript(mine)(['EVALSHA', mine.sha.toUpperCase(), '0'])).toBe(true);
    expect(isScript(mine)(['evalsha', theirs.sha, '0'])).toBe(false);
    expect(isScript(mine)(['eval', mine.source, '0'])).toBe(true);
    expect(isScript(mine)(['EVAL', theirs.source, '0'])).toBe(false);
    expect(isScript(mine)(['get', mine.sha])).toBe(false);
    expect(isScript(mine)(['evalsha'])).toBe(false);
  });

  it('isScript matches the EVALSHA of its script only, and the EVAL of its source', async () => {
    const mine = script("return 'mine'");
    const theirs = script("return 'theirs'");
    const redis = client();
    await Promise.all([redis.script('LOAD', mine.source), redis.script('LOAD', theirs.source)]);
    const delayed = proxy.delayReply(isScript(mine), 300);
    const started = performance.now();

    const theirsMs = redis.evalsha(theirs.sha, 0).then(() => performance.now() - started);
    expect(await redis.evalsha(mine.sha, 0)).toBe('mine');
    expect(performance.now() - started).toBeGreaterThanOrEqual(290);
    expect(await theirsMs).toBeLessThan(250);
    expect((await delayed).argv).toEqual(['evalsha', mine.sha, '0']);

    const dropped = proxy.dropReply(isScript(mine));
    expect(await redis.eval(mine.source, 0)).toBe('mine');
    expect((await dropped).argv).toEqual(['eval', mine.source, '0']);
  });

  it('close() cancels pending faults, delivers held replies, ends blackholes and leaves nothing open', async () => {
    const count = (type: string): number => realProcess.getActiveResourcesInfo().filter((t) => t === type).length;
    const unhandled: unknown[] = [];
    const onUnhandled = (reason: unknown): void => void unhandled.push(reason);
    realProcess.on('unhandledRejection', onUnhandled);
    try {
      // Everything this test opens is closed by its end; the rest (the direct client, the test runner) stays as it is.
      const before = { sockets: count('TCPSocketWrap'), timers: count('Timeout') };
      const own = await FaultProxy.start(server.port);
      const redis = new Redis({ host: '127.0.0.1', port: own.port, retryStrategy: () => null });
      redis.on('error', () => undefined);
      await redis.set('k', 'v');

      const neverAwaited = own.dropReply(isCommand('never'));
      const cancelled = own.delayReply(isCommand('never'), 10);
      const held = own.delayReply(isCommand('get', 'k'), 10_000);
      const get = redis.get('k');
      await eventually(() => own.log.some((seen: SeenCommand) => seen.argv[0] === 'get'));
      await sleep(50); // the reply is in the proxy now, held
      const hole = own.blackhole(10_000);

      const started = performance.now();
      await own.close();
      expect(performance.now() - started).toBeLessThan(1_000);
      expect(await get).toBe('v');
      expect((await held).argv).toEqual(['get', 'k']);
      await expect(cancelled).rejects.toBeInstanceOf(FaultCancelledError);
      await hole;
      expect(own.connectionCount).toBe(0);
      await expect(own.dropReply(isCommand('get'))).rejects.toBeInstanceOf(FaultCancelledError);

      const refused = await new Promise<string>((resolve) => {
        const probe = connect({ port: own.port, host: '127.0.0.1' });
        probe.on('error', (error: NodeJS.ErrnoException) => resolve(error.code ?? 'error'));
        probe.on('connect', () => {
          probe.destroy();
          resolve('connected');
        });
      });
      expect(refused).toBe('ECONNREFUSED');
      // No retryStrategy: the client ends with the proxy (a disconnect() now would start a timer of its own).
      expect(await eventually(() => redis.status === 'end')).toBe(true);
      expect(await eventually(() => count('TCPSocketWrap') <= before.sockets)).toBe(true);
      expect(count('TCPServerWrap')).toBe(1); // the beforeEach proxy's, not this one
      expect(count('Timeout')).toBeLessThanOrEqual(before.timers);
      await sleep(10);
      expect(unhandled).toEqual([]);
      void neverAwaited;
    } finally {
      realProcess.off('unhandledRejection', onUnhandled);
    }
  });
});
