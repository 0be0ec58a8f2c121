import type { Logger } from '@nestjs/common';
import { Redis, type Cluster, type RedisOptions } from 'ioredis';
import { describeError } from '../../errors/describe-error';
import { InvalidLockOptionsError } from '../../errors/invalid-options.error';
import type { RedisConnection } from '../../options/dislock.options';

export type RedisClient = Redis | Cluster;

/** Whether the client is a Cluster (by its flag, so a client from another copy of ioredis counts too). */
export function isClusterClient(client: RedisClient): client is Cluster {
  return (client as { isCluster?: boolean }).isCluster === true;
}

/**
 * The client's own ioredis `keyPrefix`, which it puts in front of every key it sends: part of the
 * name Redis Cluster hashes, and so of the slot a lock key lands in.
 */
export function clientKeyPrefix(client: RedisClient): string {
  return (client as { options?: { keyPrefix?: string } }).options?.keyPrefix ?? '';
}

/** A new connection with the client's own options (ioredis 6 types the two `duplicate`s apart). */
export function duplicateClient(client: RedisClient): RedisClient {
  return isClusterClient(client) ? client.duplicate() : client.duplicate();
}

/** A client and whether this library created it (and so must close it). */
export interface OwnedClient {
  readonly client: RedisClient;
  readonly owned: boolean;
}

function isClient(connection: RedisConnection): connection is RedisClient {
  // Duck-typed rather than `instanceof`, so a client from another copy of ioredis is accepted too.
  return (
    typeof connection === 'object' &&
    typeof (connection as Partial<RedisClient>).evalsha === 'function' &&
    typeof (connection as Partial<RedisClient>).eval === 'function'
  );
}

/**
 * How long a created client waits before reconnect attempt `times` (1, 2, ...): 50 ms doubling up to
 * 400 ms, plus at most a tenth of that at random. ioredis 6's own default waits up to 5 s plus up to
 * 200 ms (the jitter applies to the first attempt too); a lock library wants its waiters woken, its
 * leases renewed and its holders told what Redis lost within a second of Redis being back (its held
 * locks are checked as soon as the connection is), and its few connections cost a server little.
 */
export function reconnectDelay(times: number): number {
  const delay = Math.min(50 * 2 ** Math.min(Math.max(times, 1) - 1, 5), 400);
  return delay + Math.floor(Math.random() * (delay / 10));
}

/**
 * ioredis puts a failed command's arguments on its error (`error.command.args`): for the AUTH or
 * HELLO ... AUTH it sends on connecting, the password, which every command waiting for the
 * connection is then rejected with (and a logger that prints an error's properties, or its
 * `cause`'s, shows it). Masks those arguments, in place, in `error` and the errors it wraps.
 */
export function scrubCredentials(error: unknown): void {
  let current: unknown = error;
  for (let depth = 0; typeof current === 'object' && current !== null && depth < 5; depth += 1) {
    const holder = current as {
      command?: { name?: unknown; args?: unknown };
      cause?: unknown;
      lastNodeError?: unknown;
    };
    const command = holder.command;
    if (
      typeof command === 'object' &&
      command !== null &&
      typeof command.name === 'string' &&
      Array.isArray(command.args)
    ) {
      const args: unknown[] = command.args;
      const name = command.name.toLowerCase();
      if (name === 'auth') {
        command.args = args.map(() => '***');
      } else if (name === 'hello') {
        // HELLO protover [AUTH username password] [SETNAME name]
        const auth = args.findIndex((arg) => String(arg).toUpperCase() === 'AUTH');
        if (auth !== -1) command.args = args.map((arg, i) => (i === auth + 2 ? '***' : arg));
      }
    }
    current = holder.lastNodeError ?? holder.cause;
  }
}

/** A URL and the options that go with it (none for a bare URL), or options alone. */
function splitUrl(connection: Exclude<RedisConnection, RedisClient>): { url?: string; options: RedisOptions } {
  if (typeof connection === 'string') return { url: connection, options: {} };
  if ('url' in connection && typeof connection.url === 'string') {
    const { url, ...options } = connection;
    return { url, options };
  }
  return { options: connection };
}

/**
 * Uses the application's client as it is, or creates one from options, a URL, or a URL with
 * options (`{ url: 'rediss://user:pass@host:6380', tls: { ca, cert, key } }`: what a URL cannot
 * carry; the URL's own parts win over the same options). A created client logs connection errors
 * through Nest's logger, once per outage instead of once per retry.
 */
export function connectRedis(connection: RedisConnection, logger: Logger): OwnedClient {
  if (isClient(connection)) return { client: connection, owned: false };
  const { url, options } = splitUrl(connection);
  // ioredis uses disconnectTimeout only in disconnect(), which only closeRedis calls: once the
  // socket is ended (or already dead), drop it at once instead of keeping the process alive for the
  // default 2 s. Options given by the application win.
  const defaults: RedisOptions = { disconnectTimeout: 0, retryStrategy: reconnectDelay };
  // Behind Sentinel, ioredis otherwise stays on a demoted master until its connection drops (about
  // 11 s measured after SENTINEL FAILOVER): every lease shorter than that is lost. With the
  // detector it subscribes to the sentinels' +switch-master and moves within about a second.
  if (options.sentinels) defaults.failoverDetector = true;
  let client: Redis;
  try {
    client = url === undefined ? new Redis({ ...defaults, ...options }) : new Redis(url, { ...defaults, ...options });
  } catch (error) {
    // Node's URL parser keeps the whole URL, password included, in the error it throws (`input`):
    // say what failed without it.
    if (url === undefined) throw error;
    throw new InvalidLockOptionsError(
      'redis',
      `DisLockModule: option "redis" is not a valid Redis URL (${describeError(error)}); ` +
        'the URL is not shown because it may hold a password',
    );
  }
  let failing = false;
  client.on('error', (error: Error) => {
    // ioredis rejects the waiting commands with this same error just before emitting it, and their
    // handlers run only after this listener: none of them sees the password.
    scrubCredentials(error);
    if (failing) return;
    failing = true;
    logger.warn(`Redis connection error: ${error.message}; lock operations fail until it reconnects`);
  });
  client.on('ready', () => {
    if (failing) logger.log('Redis connection restored');
    failing = false;
  });
  return { client, owned: true };
}

/** Closes a created client: QUIT politely when connected, and drop the socket if that does not answer in time. */
export async function closeRedis(client: RedisClient, timeoutMs: number): Promise<void> {
  if (client.status === 'end') return;
  if (client.status !== 'ready') {
    client.disconnect(); // not connected: a QUIT would only wait in the offline queue
    return;
  }
  let timer: NodeJS.Timeout | undefined;
  try {
    await Promise.race([
      client.quit(),
      new Promise<void>((resolve) => {
        timer = setTimeout(resolve, timeoutMs);
        timer.unref();
      }),
    ]);
  } catch {
    // A client that cannot QUIT is dropped below either way.
  } finally {
    clearTimeout(timer);
    client.disconnect();
  }
}
