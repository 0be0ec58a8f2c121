import type { Logger } from '@nestjs/common';
import { Redis, type Cluster, type RedisOptions } from 'ioredis';
import type { RedisConnection } from '../module/dislock.options';

export type RedisClient = Redis | Cluster;

/** Whether the client is a Cluster (by its flag, so a client from another copy of ioredis counts too). */
export function isClusterClient(client: RedisClient): client is Cluster {
  return (client as { isCluster?: boolean }).isCluster === true;
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
 * 1 s, plus at most a tenth of that at random. ioredis 6's own default waits up to 5 s plus up to
 * 200 ms (the jitter applies to the first attempt too); a lock library wants its waiters woken and
 * its leases renewed soon after Redis is back, and its few connections cost a server little.
 */
export function reconnectDelay(times: number): number {
  const delay = Math.min(50 * 2 ** Math.min(Math.max(times, 1) - 1, 5), 1_000);
  return delay + Math.floor(Math.random() * (delay / 10));
}

/**
 * Uses the application's client as it is, or creates one from options or a URL. A created client
 * logs connection errors through Nest's logger, once per outage instead of once per retry.
 */
export function connectRedis(connection: RedisConnection, logger: Logger): OwnedClient {
  if (isClient(connection)) return { client: connection, owned: false };
  // ioredis uses disconnectTimeout only in disconnect(), which only closeRedis calls: once the
  // socket is ended (or already dead), drop it at once instead of keeping the process alive for the
  // default 2 s. Options given by the application win.
  const defaults: RedisOptions = { disconnectTimeout: 0, retryStrategy: reconnectDelay };
  const client =
    typeof connection === 'string'
      ? new Redis(connection, defaults)
      : new Redis({ ...defaults, ...(connection satisfies RedisOptions) });
  let failing = false;
  client.on('error', (error: Error) => {
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
