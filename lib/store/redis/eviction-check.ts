import type { Redis } from 'ioredis';
import { isClusterClient, type RedisClient } from './redis-client';

/**
 * What each eviction policy does to locks, for the warning (Redis's `maxmemory-policy` values).
 * Only `noeviction` keeps them: every lock key has an expiry, so the `volatile-*` policies evict
 * them too, and first of all when the other keys (a cache without TTLs) have none.
 */
function whatItDoes(policy: string): string {
  if (policy.startsWith('allkeys-')) return 'it evicts any key when memory is full, held locks included';
  if (policy.startsWith('volatile-')) {
    return 'it evicts keys with an expiry when memory is full, and every held lock has one (they go first when the other keys have none)';
  }
  return 'it may evict held locks when memory is full';
}

/** One server's memory settings, as `INFO memory` reports them (readable where `CONFIG GET` is refused). */
export interface EvictionSetting {
  readonly node: string;
  readonly maxmemory: number;
  readonly policy: string;
}

/** `INFO memory` of one server, parsed. */
export function evictionSettingOf(node: string, info: string): EvictionSetting {
  const field = (name: string): string | undefined => new RegExp(`^${name}:(.*)$`, 'm').exec(info)?.[1]?.trim();
  return { node, maxmemory: Number(field('maxmemory') ?? 0), policy: field('maxmemory_policy') ?? 'noeviction' };
}

/**
 * A warning for each server (every master of a Cluster) that may evict held locks: a `maxmemory`
 * is set and the policy is anything but `noeviction`. Then a second process can take a lock its
 * holder still runs under, and a holder with a fixed lease learns it only at its next check.
 * `bounded` limits each `INFO` to the store's `operationTimeout`; a server that does not answer is
 * skipped. `named`: each warning names its server's address (for logs); otherwise it does not
 * (for a health check's body, which may reach any HTTP client).
 */
export async function evictionWarnings(
  client: RedisClient,
  bounded: <T>(operation: Promise<T>) => Promise<T>,
  named = true,
): Promise<string[]> {
  const servers: Redis[] = isClusterClient(client) ? client.nodes('master') : [client];
  const subject = (setting: EvictionSetting): string =>
    named ? `Redis ${setting.node}` : isClusterClient(client) ? 'A Redis Cluster master' : 'Redis';
  const settings = await Promise.all(
    servers.map(async (server) => {
      try {
        const info = await bounded(server.info('memory'));
        return evictionSettingOf(`${server.options.host ?? 'localhost'}:${server.options.port ?? 6379}`, info);
      } catch {
        return undefined;
      }
    }),
  );
  return settings.flatMap((setting) =>
    setting && setting.maxmemory > 0 && setting.policy !== 'noeviction'
      ? [
          `${subject(setting)} has maxmemory ${setting.maxmemory} bytes with maxmemory-policy ${setting.policy}: ` +
            `${whatItDoes(setting.policy)}, and another process then takes such a lock while its holder still runs. ` +
            `Use maxmemory-policy noeviction on the Redis that holds locks.`,
        ]
      : [],
  );
}
