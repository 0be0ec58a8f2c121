import { randomBytes } from 'node:crypto';
import type { Redis } from 'ioredis';
import { RENEW_SCRIPT } from '../../lib/store/redis/scripts/renew.script';

/** What MONITOR saw of the renewals of one key. */
export interface RenewalsSeen {
  /** Renewals Redis ran for the key so far: renew-script calls naming it with a lease (0 is a check). */
  count(): number;
  /** Resolves once MONITOR has shown every command Redis ran before this call. */
  synced(): Promise<void>;
}

/**
 * Counts, by MONITOR on `monitor`, the renewals Redis runs for `key` (renew-script calls naming it
 * with a lease; a lease of 0 is a check). The script must be loaded (each renewal one EVALSHA).
 * `synced` sends a marker through `client` and resolves once MONITOR shows it: Redis feeds MONITOR
 * in the order it runs commands, so every renewal before it has been counted.
 */
export function countRenewals(monitor: Redis, client: Redis, key: string): RenewalsSeen {
  const markers = new Map<string, () => void>();
  let count = 0;
  monitor.on('monitor', (_time: string, args: string[]) => {
    const [command, first] = args;
    const marker = /^echo$/i.test(command) ? markers.get(first) : undefined;
    if (marker) return marker();
    if (!/^evalsha$/i.test(command) || first !== RENEW_SCRIPT.sha) return;
    const keys = args.slice(3, 3 + Number(args[2]));
    const argv = args.slice(3 + keys.length);
    keys.forEach((named, i) => {
      if (named === key && Number(argv[2 * i + 1]) !== 0) count += 1;
    });
  });
  return {
    count: () => count,
    synced: async () => {
      const marker = `dislock-test-sync:${randomBytes(8).toString('hex')}`;
      const seen = new Promise<void>((resolve) => markers.set(marker, resolve));
      await client.echo(marker);
      await seen;
    },
  };
}

/**
 * `countRenewals` on a MONITOR connection of its own, with the renew script loaded first (so that
 * each renewal is one EVALSHA, never an EVALSHA refused with NOSCRIPT and then an EVAL); `stop`
 * closes that connection.
 */
export async function followRenewals(client: Redis, key: string): Promise<RenewalsSeen & { stop(): void }> {
  await client.script('LOAD', RENEW_SCRIPT.source);
  const monitor = await client.monitor();
  return { ...countRenewals(monitor, client, key), stop: () => monitor.disconnect() };
}
