import type { Logger } from '@nestjs/common';
import type { Cluster, Redis } from 'ioredis';
import type { ReplicaAckOptions } from '../../options/dislock.options';
import { keySlot } from './fence-key';
import { ReplicaShortfallError } from '../store-errors';
import { clientKeyPrefix, isClusterClient, type RedisClient } from './redis-client';

/**
 * Replica acknowledgement of acquisitions. Redis replicates asynchronously: a lock taken just
 * before its master dies, before any replica has it, is free again on the promoted replica, and a
 * second caller gets it while the first still believes it holds it. `WAIT min timeout`, sent on
 * the connection that ran the acquisition, blocks until `min` replicas have every write that
 * connection made, or until `timeout`; only then does the acquisition count.
 *
 * The cost: one more round trip per acquisition, and, while replicas lag, `timeout` ms during
 * which lock commands queued behind the WAIT on the same connection wait too. It narrows the
 * failover hole to what `min` replicas can lose together; it does not make Redis consistent (a
 * replica that acknowledged can still lose the write if it restarts without persistence).
 */
export class ReplicaAck {
  constructor(
    private readonly options: Required<ReplicaAckOptions>,
    private readonly logger: Logger,
  ) {}

  /**
   * Resolves once `min` replicas have the writes of the connection that holds `key`; otherwise
   * rejects with `ReplicaShortfallError` (`onShortfall: 'throw'`) or logs a warning and resolves.
   * Rejects as the client does when the WAIT itself fails.
   */
  async confirm(client: RedisClient, key: string): Promise<void> {
    const { min, timeout, onShortfall } = this.options;
    const confirmed = await connectionOf(client, key).wait(min, timeout);
    if (confirmed >= min) return;
    if (onShortfall === 'throw') throw new ReplicaShortfallError(confirmed, min, timeout);
    this.logger.warn(
      `Lock key "${key}" is held, but only ${confirmed} of ${min} replica(s) confirmed it within ${timeout} ms: ` +
        'a failover now could give it to a second holder',
    );
  }
}

/** The connection an acquisition of `key` ran on: the client itself, or on a Cluster the master of its slot. */
function connectionOf(client: RedisClient, key: string): Redis | Cluster {
  if (!isClusterClient(client)) return client;
  const nodeKey = client.slots[keySlot(clientKeyPrefix(client) + key)]?.[0];
  const node = client.nodes('master').find((master) => `${master.options.host}:${master.options.port}` === nodeKey);
  if (!node) throw new Error(`No connection to the master of the slot of "${key}" to send WAIT on`);
  return node;
}
