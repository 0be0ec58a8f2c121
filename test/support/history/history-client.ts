/**
 * The Redis connection a history worker gives `DisLockModule.forRoot`, as the run drew it: one
 * Redis, through the worker's fault proxy, as `RedisOptions` the module passes on to the client it
 * creates (`commandTimeout`, `enableAutoPipelining`: what users set); or a Cluster client of the
 * worker's own (as the module takes a Cluster), whose `natMap` sends each node's traffic through
 * the worker's fault proxy for that node.
 */
import { Cluster, type ClusterNode, type NatMap, type Redis } from 'ioredis';
import type { RedisConnection } from 'nestjs-dislock';

export interface HistoryClientConfig {
  /** One Redis: this worker's proxy. */
  readonly url?: string;
  /** A Cluster: its seed nodes (proxies) and each node's announced `host:port` mapped to this worker's proxy for it. */
  readonly cluster?: {
    readonly seeds: readonly ClusterNode[];
    readonly natMap: Record<string, { host: string; port: number }>;
  };
  /** ioredis's own per-command timeout, in ms, if the run drew one. */
  readonly commandTimeout?: number;
  readonly autoPipelining: boolean;
}

export interface HistoryConnection {
  readonly redis: RedisConnection;
  /** The client the worker created (a Cluster's), to close after the app; undefined when the module owns it. */
  readonly client?: Redis | Cluster;
}

export function historyConnection(config: HistoryClientConfig): HistoryConnection {
  const timeout = config.commandTimeout === undefined ? {} : { commandTimeout: config.commandTimeout };
  if (config.cluster) {
    const natMap: NatMap = config.cluster.natMap;
    const client = new Cluster([...config.cluster.seeds], {
      natMap,
      enableAutoPipelining: config.autoPipelining,
      redisOptions: timeout,
    });
    client.on('error', () => undefined);
    return { redis: client, client };
  }
  if (config.url === undefined) throw new Error('historyConnection: neither a url nor a cluster');
  return { redis: { url: config.url, enableAutoPipelining: config.autoPipelining, ...timeout } };
}

/** Reads Redis's clock (µs, as fencing tokens count) on the connection that serves `key`. */
export const CLOCK_SCRIPT = `local t = redis.call('time') return t[1] .. string.format('%06d', tonumber(t[2]))`;

export async function redisClock(client: Redis | Cluster, key: string): Promise<number> {
  return Number(await client.eval(CLOCK_SCRIPT, 1, key));
}
